"""The grid's X.509 conventions: certificate chains checked as grid services check them
(`x509auth.py`), RFC 3820 proxy certificates (`proxycert.py`), CA directory names
(`certs.py`), and where a grid client finds its credential and CAs (`gridenv.py`)."""
