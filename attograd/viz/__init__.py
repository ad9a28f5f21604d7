"""The web visualizer: a recorded trace (uop/trace.py) saved as JSON (uop/tracefile.py), served with its page (serve.py, static/).
`VIZ=1 python prog.py` records, saves and serves at exit; `python -m attograd.viz TRACE [--port N]` serves a saved one."""
