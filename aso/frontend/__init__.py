"""The X.509 front end, the only public entrance to the document store: the server
(`server.py`), the route table (`routes.py`) and the gate that matches requests against it
(`gate.py`), the check of a client's `since` (`sequences.py`), and docs/openapi.yaml generated
from the table (`openapi.py`)."""
