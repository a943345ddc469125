"""Entry point: ``python -m meshwork_moto --host 127.0.0.1 --port P``.

The same server as moto's ``moto_server`` (werkzeug, threaded, moto's request handler),
with the patches applied and the control layer of control.py in front.

``python -m meshwork_moto --probe --port P`` is its health probe (for an image without a
shell): exit 0 when a patched server on 127.0.0.1:P answers its own control endpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from werkzeug.serving import run_simple


def _exit(signum: Any, frame: Any) -> None:
    sys.exit(0)


def probe(port: int) -> int:
    """0 when the control endpoint of a patched server on 127.0.0.1:``port`` answers 200."""
    from urllib.request import urlopen

    try:
        with urlopen(f"http://127.0.0.1:{port}/meshwork/calls", timeout=2) as reply:
            return 0 if reply.status == 200 else 1
    except OSError as err:
        print(f"meshwork_moto probe: {err}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="meshwork_moto")
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    parser.add_argument(
        "--probe", action="store_true", help="check that the server on --port answers, then exit"
    )
    args = parser.parse_args(argv)
    if args.probe:
        sys.exit(probe(args.port))
    # moto sends some requests to itself and reads the port from here, as moto_server does.
    os.environ.setdefault("MOTO_PORT", str(args.port))

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )

    from . import apply
    from .control import MeshworkApp

    apply()
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    print(f"meshwork_moto: patches applied, serving on {args.host}:{args.port}", flush=True)
    app = MeshworkApp(DomainDispatcherApplication(create_backend_app))
    run_simple(args.host, args.port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
