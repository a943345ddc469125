"""WSGI layer in front of moto: fault injection, call counting, reset, request serialisation.

Control endpoints (JSON):
  POST   /meshwork/faults  {"rules": [{"action": A, "error": CODE, "status": 503, "count": 2,
                                     "message": M, "delay_ms": N}]}  appends rules
  GET    /meshwork/faults  the rules not yet used up
  DELETE /meshwork/faults  clears the rules
  GET    /meshwork/calls   {"Action": calls received, ...} (failed and faulted calls included)
  DELETE /meshwork/calls   zeroes the counters
  POST   /moto-api/reset   moto's reset, which here also clears rules and counters

A rule applies to the next `count` (default 1) calls of `action`: it first waits `delay_ms`
(if given), then answers with the EC2 XML error `error` and HTTP `status` (default 400) if
`error` is given, else lets the call through. Rules for one action apply in order.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from io import BytesIO
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

StartResponse = Callable[..., Any]

# moto's models are not thread-safe and werkzeug serves each request on its own thread:
# serialise EC2 calls (and resets) so concurrent allocations cannot pick the same address.
# Only EC2: other moto services may call this server from inside a request (Lambda
# containers, for one), which a global lock would deadlock. Fault delays happen before the
# lock, so delayed calls do not hold up the others.
MOTO_LOCK = threading.RLock()


class Faults:
    """Pending fault rules and per-action call counters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[dict[str, Any]] = []
        self._calls: Counter[str] = Counter()

    def add(self, rules: list[dict[str, Any]]) -> None:
        checked = [_checked_rule(rule) for rule in rules]
        with self._lock:
            self._rules.extend(checked)

    def rules(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(rule) for rule in self._rules]

    def clear_rules(self) -> None:
        with self._lock:
            self._rules.clear()

    def calls(self) -> dict[str, int]:
        with self._lock:
            return dict(self._calls)

    def clear_calls(self) -> None:
        with self._lock:
            self._calls.clear()

    def on_call(self, action: str) -> dict[str, Any] | None:
        """Counts the call and takes one use of the first rule for its action."""
        with self._lock:
            self._calls[action] += 1
            for rule in self._rules:
                if rule["action"] == action:
                    rule["count"] -= 1
                    if rule["count"] <= 0:
                        self._rules.remove(rule)
                    return dict(rule)
        return None


def _checked_rule(rule: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(rule, dict) or not isinstance(rule.get("action"), str):
        raise ValueError(f"a rule needs a string 'action': {rule!r}")
    if "error" not in rule and "delay_ms" not in rule:
        raise ValueError(f"a rule needs 'error' or 'delay_ms': {rule!r}")
    return {
        "action": rule["action"],
        "error": rule.get("error"),
        "message": rule.get("message") or f"Injected fault: {rule.get('error')}",
        "status": int(rule.get("status", 400)),
        "count": int(rule.get("count", 1)),
        "delay_ms": int(rule.get("delay_ms", 0)),
    }


def ec2_error_body(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code>"
        f"<Message>{escape(message)}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()


def _respond(
    start_response: StartResponse, status: int, body: bytes, content_type: str
) -> list[bytes]:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
    start_response(
        f"{status} {reason}",
        [("Content-Type", content_type), ("Content-Length", str(len(body)))],
    )
    return [body]


def _json(start_response: StartResponse, status: int, value: Any) -> list[bytes]:
    return _respond(start_response, status, json.dumps(value).encode(), "application/json")


def _read_body(environ: dict[str, Any]) -> bytes:
    """Reads the request body and puts it back for moto."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    environ["wsgi.input"] = BytesIO(body)
    return body


def action_of(environ: dict[str, Any]) -> str | None:
    """The query-protocol Action (EC2 sends it in a form body; GETs in the query string)."""
    query = parse_qs(environ.get("QUERY_STRING", ""))
    if "Action" in query:
        return query["Action"][0]
    if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
        form = parse_qs(_read_body(environ).decode("utf-8", "replace"))
        if "Action" in form:
            return form["Action"][0]
    return None


def is_ec2(environ: dict[str, Any]) -> bool:
    """Whether the request is SigV4-signed for EC2 (credential scope .../ec2/aws4_request)."""
    return "/ec2/aws4_request" in environ.get("HTTP_AUTHORIZATION", "")


class MeshworkApp:
    """Wraps moto's WSGI application."""

    def __init__(self, moto_app: Callable[[dict[str, Any], StartResponse], Iterable[bytes]]):
        self.moto_app = moto_app
        self.faults = Faults()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET")
        if path.startswith("/meshwork/"):
            return self.control(method, path, environ, start_response)
        if path.rstrip("/") == "/moto-api/reset" and method == "POST":
            self.faults.clear_rules()
            self.faults.clear_calls()
        action = action_of(environ)
        rule = self.faults.on_call(action) if action else None
        if rule:
            if rule["delay_ms"]:
                time.sleep(rule["delay_ms"] / 1000)  # the injected latency itself
            if rule["error"]:
                body = ec2_error_body(rule["error"], rule["message"])
                return _respond(start_response, rule["status"], body, "text/xml")
        if is_ec2(environ) or path.startswith("/moto-api/reset"):
            with MOTO_LOCK:
                return list(self.moto_app(environ, start_response))
        return self.moto_app(environ, start_response)

    def control(
        self, method: str, path: str, environ: dict[str, Any], start_response: StartResponse
    ) -> list[bytes]:
        if path == "/meshwork/faults" and method == "POST":
            try:
                rules = json.loads(_read_body(environ) or b"{}").get("rules", [])
                self.faults.add(rules)
            except (ValueError, AttributeError, TypeError) as err:
                return _json(start_response, 400, {"error": str(err)})
            return _json(start_response, 200, {"rules": self.faults.rules()})
        if path == "/meshwork/faults" and method == "GET":
            return _json(start_response, 200, {"rules": self.faults.rules()})
        if path == "/meshwork/faults" and method == "DELETE":
            self.faults.clear_rules()
            return _json(start_response, 200, {"rules": []})
        if path == "/meshwork/calls" and method == "GET":
            return _json(start_response, 200, self.faults.calls())
        if path == "/meshwork/calls" and method == "DELETE":
            self.faults.clear_calls()
            return _json(start_response, 200, {})
        return _json(start_response, 404, {"error": f"no such control endpoint: {method} {path}"})
