"""The one error every part of the bench raises for a setting or run that cannot go on."""


class BenchError(Exception):
    """A bench setting that cannot run; the message says what to fix."""
