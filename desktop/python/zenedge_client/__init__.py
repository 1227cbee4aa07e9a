"""zenedge_client: talk to a local zenedge daemon from Python without torch or zenedge itself.

    from zenedge_client import discover
    client = discover()                      # the running daemon of ZENEDGE_HOME / the default home
    for chunk in client.chat_stream({"model": "writer", "messages": [{"role": "user", "content": "hi"}]}):
        print(chunk["choices"][0]["delta"].get("content", ""), end="")

Types (TypedDicts) in `zenedge_client.wire` are generated from desktop/openapi.json.
"""

from zenedge_client.client import DaemonUnavailable, ZenedgeClient, ZenedgeError
from zenedge_client.discovery import default_home, discover, read_daemon_info, read_token

__all__ = ["DaemonUnavailable", "ZenedgeClient", "ZenedgeError", "default_home", "discover", "read_daemon_info",
           "read_token"]
