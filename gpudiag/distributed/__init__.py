"""gpudiag as a torch.distributed job: a doctor that runs on every rank, and multi-rank trials.

``group``: torchrun's environment, the process group (gloo on a CPU, NCCL on GPUs, the same
code) and gathering to rank 0; ``launch``: starting N local ranks through
``torch.distributed.run`` from a notebook or a test; ``doctor``: every rank's evidence merged
into one report; ``trial``: the workload under DDP and FSDP2 on every rank, measured;
``compare``: ``gd.compare(..., nproc=N)`` from the notebook side (it starts the ranks and reads
back their Comparison). This package sits above experiment and workloads (ARCHITECTURE.md).
"""
