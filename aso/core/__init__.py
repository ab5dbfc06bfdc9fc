"""ASO's core: what is done to a request, as plain functions over documents (as Rucio's daemons
call rucio.core). The agents and the reconciler decide when; these functions say what."""
