"""ASO agents: one module per daemon (submitter, monitor, ...), each a thin loop over aso."""
