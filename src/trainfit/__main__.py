"""`python -m trainfit ...`: the `trainfit` command, for an environment whose scripts folder is not on PATH."""
from .cli.app import main

main()
