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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class StreamOrder:
    """The stream of the last eager call; ``follow()`` orders the current stream after it where they differ."""

    current: Callable[[], Any]  # the caller's current stream: an object with ``wait_stream`` and ``==``
    capturing: Callable[[], bool]  # whether the current stream is capturing a CUDA graph
    last: Any = None
    waits: int = 0  # how many calls waited for another stream

    def follow(self) -> None:
        """Before an eager call's first GPU work: wait for the previous call's stream if it was another one."""
        if self.capturing():
            return
        stream = self.current()
        last, self.last = self.last, stream
        if last is not None and stream != last:
            stream.wait_stream(last)
            self.waits += 1


def torch_order() -> StreamOrder:
    """Ordering over torch's current CUDA stream."""
    import torch

    return StreamOrder(torch.cuda.current_stream, torch.cuda.is_current_stream_capturing)
