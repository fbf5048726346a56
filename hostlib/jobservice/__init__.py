"""The job service's client and its gRPC stubs (proto), shared by workers, host aggregators and
inaggctl; the controller serves it (inagg.controller). Bottom layer beside inagg.hostlib.wire."""
