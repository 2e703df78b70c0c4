"""`python -m sqla_queue`: the `sqla-queue` command line."""

from sqla_queue.cli import main

main(prog_name="sqla-queue")
