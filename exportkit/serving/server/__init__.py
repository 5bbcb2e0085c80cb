"""exportkit's embedded TF-Serving-protocol server, file for file after TF Serving's own sources
(model_servers/, servables/tensorflow/, util/): the same services, status codes, texts, batching and policies."""
