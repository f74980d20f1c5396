"""``python -m gpudiag`` is the ``gpudiag`` command."""

from gpudiag._rank_exit import run_main
from gpudiag.cli import main

run_main(main)  # under torchrun, a rank ends without torch's teardown (see _rank_exit)
