"""The host aggregator: the slot engine (engine, the C++ one; engine_reference, its Python
specification) and the server that runs it (server, ``inagg-aggregator``). The software switch
reuses the engine."""
