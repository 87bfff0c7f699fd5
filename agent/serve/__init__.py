"""`sandcell serve`: the HTTP API over `Agent`/`Session` and one `SandboxPool`.

app.py makes the FastAPI app (JSON errors, the body cap of bodylimit.py), routes.py holds the
routes, auth.py the tokens; guard.py checks Host, Origin and the token before any body is
read, signin.py asks for a click before a link from another site signs anyone in; sessions.py keeps the served sessions and the server's limits,
served.py one session and its turn, sandboxes.py the sandbox an idle session gives back;
stream.py turns a question's events into server-sent events; files.py is the one place where
names from a client meet paths on disk."""

from sandcell.agent.serve.app import create_app
from sandcell.agent.serve.config import ServeConfig

__all__ = ["ServeConfig", "create_app"]
