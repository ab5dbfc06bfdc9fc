"""Setting a store up for ASO and checking it: the databases with their design documents and
`_security` (`designdocs.py`, `aso db init`), and `aso store check` (`store_check.py`)."""
