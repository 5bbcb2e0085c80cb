"""Times Predict through exportkit's ServingClient and through a bare stub, in one fresh process (make bench).

Usage: predict_worker.py ADDRESS MODEL_NAME VERSION_DIR CALLS; prints {"ours": [s], "bare": [s], "batch": N}.
"""
import json
import sys
import time
from pathlib import Path

from exportkit.tfenv import import_tf
tf = import_tf()
import grpc
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from exportkit.serving.client.grpc_client import ServingClient
from exportkit.savedmodel.layout import read_golden

address, name, version_dir, calls = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
inputs = read_golden(Path(version_dir))[0][-1]   # the batch of 8

client = ServingClient(address, name)
# What a user writes without exportkit: one channel, one stub, a request built once, Predict in a loop.
channel = grpc.insecure_channel(address)
stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
request = predict_pb2.PredictRequest()
request.model_spec.name = name
request.model_spec.signature_name = "serving_default"
for key, value in inputs.items():
    request.inputs[key].CopyFrom(tf.make_tensor_proto(value))

for _ in range(10):   # warm both channels and the server
    client.predict(inputs)
    stub.Predict(request, timeout=30.0)
ours, bare = [], []
block = 10
for _ in range(max(1, calls // block)):   # alternate blocks so drift hits both alike
    for _ in range(block):
        t = time.perf_counter(); client.predict(inputs); ours.append(time.perf_counter() - t)
    for _ in range(block):
        t = time.perf_counter(); stub.Predict(request, timeout=30.0); bare.append(time.perf_counter() - t)
print(json.dumps({"ours": ours, "bare": bare, "batch": int(len(next(iter(inputs.values()))))}))
