"""``python -m kevload``."""

from kevload.cli import main

main()
