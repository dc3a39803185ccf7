"""The port engine: plans with port channels across hosts, run as per-rank programs over torch.distributed."""
