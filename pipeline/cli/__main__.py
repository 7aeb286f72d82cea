"""`python -m pipeline.cli`: the `tracelake` command."""

from . import app

app()
