"""TF Serving, as exportkit speaks and imitates it: server/ (its parts, file for file), client/ (gRPC, REST,
request samples), launch/ (which server, where), json/ (the REST codec by direction), warm-up records and
TensorProto conversion."""
