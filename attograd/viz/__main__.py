"""python -m attograd.viz TRACE [--port N]: serve a trace that VIZ=1 saved (its path is printed at exit)."""
import argparse, os
from attograd.uop.tracefile import load
from attograd.viz.serve import serve

def main() -> None:
  ap = argparse.ArgumentParser(prog="python -m attograd.viz", description="Serve a saved VIZ trace in the browser.")
  ap.add_argument("trace", help="a trace file written by VIZ=1 (VIZ_TRACE=path chooses where)")
  ap.add_argument("--port", type=int, default=int(os.getenv("VIZ_PORT", "8000")), help="port on 127.0.0.1 (0: any free one)")
  args = ap.parse_args()
  try: data = load(args.trace)
  except ValueError as e: ap.error(str(e))
  serve(data, args.port)

if __name__ == "__main__": main()
