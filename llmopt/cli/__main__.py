"""`python -m llmopt.cli`: how the bench launcher and the tests start the CLI."""

from llmopt.cli import main

main()
