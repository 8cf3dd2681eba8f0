"""What the tests share that is not a fixture: fakes, job helpers, the GlusterFS test cluster, the
fault matrix, the end-to-end helpers. `tests/conftest.py` puts `tests/` on `sys.path`, so a test
imports `from support.jobs import cli`; the scripts here that run by path (`fake_worker.py`,
`fault_matrix.py`, `cluster.py`) put it there themselves."""
