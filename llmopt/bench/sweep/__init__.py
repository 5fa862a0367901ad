"""The sweep wing: a recipe read into settings (`recipe`, `config`), the matrix of points it asks for
(`matrix`, `habit`), and the run that measures them (`sweep.run_sweep`, with `rounds`, `repeats`,
`search` and `resume`). It is the top of the bench: it drives servers/, load/, measure/ and observe/
and writes the run folder (rundir.py); nothing below imports it."""
