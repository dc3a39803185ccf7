"""One communicator's eager calls in one order on the GPU, whatever streams the caller issues them on.

A staging engine's calls share the staging buffers and, per plan and size, one context: its scratch, its
semaphores and its launch counters. An LL execution may start while its peers still read the previous one's
packets, because a rank is never more than one execution ahead: its next launch waits for its stream. Two launches
of one context on two streams of one rank break that (CUDA runs them at once): the later one may overwrite packets
a peer has not read yet, which that peer then waits for until the executor's timeout ("packets never arrived"),
and its copy into the staging input may overwrite what the earlier one still reads. A CUDA-graph warm-up on a side
stream right after ``comm.capture(sizes=...)`` prepared a size on the current stream is such a pair
(examples/moe_layer.py's all-to-all graph, issue 36). NCCL orders a communicator's operations across streams too.

So each eager call first makes its stream wait for the work issued so far on the stream of the call before it
(an event, only when the stream changed). Calls captured into a CUDA graph are not ordered here: capture begins
after ``torch.cuda.graph`` synchronized the device, and a replay runs in its stream's order, so replay a graph on
the stream of the eager calls around it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass


@dataclass
class StreamOrder:
    """The stream of the last eager call; ``follow()`` orders the current stream after it where they differ."""

    current: Callable[[], Hashable]  # the caller's current stream, as a key (torch: its raw handle)
    wait: Callable[[Hashable, Hashable], None]  # wait(stream, earlier): stream waits for the work issued on earlier
    capturing: Callable[[], bool]  # whether the current stream is capturing a CUDA graph
    last: Hashable = None
    waits: int = 0  # how many calls waited for another stream

    def follow(self) -> None:
        """Before an eager call's first GPU work: wait for the previous call's stream if it was another one."""
        stream = self.current()
        if stream == self.last or self.capturing():  # the common case costs one handle lookup
            return
        if self.last is not None:
            self.wait(stream, self.last)
            self.waits += 1
        self.last = stream


def torch_order(device: int | None = None) -> StreamOrder:
    """Ordering over torch's current CUDA stream on ``device`` (default: the current device at each call)."""
    import torch

    def current() -> Hashable:
        return torch._C._cuda_getCurrentRawStream(torch.cuda.current_device() if device is None else device)

    def wait(stream: Hashable, earlier: Hashable) -> None:
        torch.cuda.ExternalStream(stream, device).wait_stream(torch.cuda.ExternalStream(earlier, device))

    return StreamOrder(current, wait, torch.cuda.is_current_stream_capturing)
