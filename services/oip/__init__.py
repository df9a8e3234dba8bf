"""The Open Inference Protocol v2 over gRPC: KServe's ``grpc_predict_v2.proto`` and the
modules protoc generates from it (how to regenerate them: the comment atop the .proto)."""
