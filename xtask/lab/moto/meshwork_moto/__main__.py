"""Entry point: ``python -m meshwork_moto --host 127.0.0.1 --port P``.

The same server as moto's ``moto_server`` (werkzeug, threaded, moto's request handler),
with the patches applied and the control layer of control.py in front.
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="meshwork_moto")
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args(argv)
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
