"""``python -m gpudiag`` is the ``gpudiag`` command."""

from gpudiag._rank_exit import exit_process
from gpudiag.cli import main

exit_process(main())  # under torchrun, a rank ends without torch's teardown (see _rank_exit)
