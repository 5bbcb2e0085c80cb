"""Which server answers and where it runs: process (handles, children, waiting until AVAILABLE), binary
(tensorflow_model_server), docker, embedded (exportkit's own), remote (HOST:PORT); modes chooses among them."""
