"""What the terminal and the notebook share: a subcommand's arguments and work, defined once.

``gpudiag.cli`` (``gpudiag NAME``) and ``gpudiag.magics`` (``%gpudiag NAME``) are two thin
front ends over these modules and never import each other. A module here has a one-line
docstring (the help), ``add_arguments(parser)`` and the functions that do the work.
"""
