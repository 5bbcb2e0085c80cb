"""Clients of a TF Serving (real or embedded): gRPC (grpc_client), REST (rest_client) and the request samples
`inspect --requests` writes."""
