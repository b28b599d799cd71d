"""`training-wizard vllm-serve --model NAME [--host H] [--port P] ...`: a vLLM engine in its own process, for
`vllm_mode = "server"`.

A small HTTP API (JSON, standard library server; one request at a time, as the engine runs one batch at a time):

  GET  /health               {"model": name, "config": the model's transformers config, "max_model_len": n}
  POST /generate             {"prompts": [[token ids]], "seeds": [int], "max_tokens", "temperature",
                              "stop_token_ids", "options"} -> {"tokens": [[ids]], "logprobs": [[float]]}
  POST /update_weights       body: safetensors bytes of checkpoint-named tensors, loaded in place
  POST /reset_prefix_cache   after the last weight batch of a push

Prompts travel as token ids, and each row carries its sampling key as its seed (rollout/vllm.py). Weights travel
over HTTP, which works wherever the trainer reaches the server; it copies every weight through the network
stack on each push, so on GPUs a collective (NCCL) transfer would be faster, and is not built here.
"""

from __future__ import annotations

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from training_wizard.errors import USER_ERROR_EXIT_CODE, UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="training-wizard vllm-serve",
                                     description="Serve a model with vLLM for training with vllm_mode = \"server\".")
    parser.add_argument("--model", required=True, help="the policy's model: a local folder, a cached hub id or a "
                        "packaged model name, as in [model] pretrained_name")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="weight dtype; the trainer's pushed weights are cast to it (default float32)")
    parser.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="share of GPU memory (default 0.9)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per engine (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="engine seed (each request brings its own)")
    return parser


class Engine:
    """The vLLM engine and what the handlers do with it."""

    def __init__(self, args: argparse.Namespace):
        from training_wizard.rollout.vllm import check_engine_can_run, import_vllm, on_cpu
        from training_wizard.specs.model import TransformerSpec

        vllm = import_vllm()
        spec = TransformerSpec(pretrained_name=args.model)
        folder = str(spec.resolved_path())
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(folder)
        check_engine_can_run(config, sleep_mode=False)
        self.vllm, self.name, self.config = vllm, args.model, config
        self.llm = vllm.LLM(
            model=folder, dtype=args.dtype, max_model_len=args.max_model_len, seed=args.seed,
            logprobs_mode="processed_logprobs", skip_tokenizer_init=True, enforce_eager=on_cpu(),
            gpu_memory_utilization=args.gpu_memory_utilization, tensor_parallel_size=args.tensor_parallel_size,
            enable_prefix_caching=False,
        )

    def health(self) -> dict[str, Any]:
        return {"model": self.name, "config": self.config.to_dict(),
                "max_model_len": self.llm.llm_engine.model_config.max_model_len}

    def generate(self, request: dict[str, Any]) -> dict[str, Any]:
        from training_wizard.rollout.generation import GenerationParams
        from training_wizard.rollout.vllm import sampled_rows, sampling_params

        # "stop_token_id": a trainer of an earlier version (one id); without it every row would run to max_tokens
        stop = request.get("stop_token_ids") or ([request["stop_token_id"]] if request.get("stop_token_id") is not None
                                                 else [])
        params = GenerationParams(int(request["max_tokens"]), float(request["temperature"]),
                                  tuple(int(t) for t in stop), 0)
        per_row = [sampling_params(self.vllm, params, seed, request.get("options") or {}) for seed in request["seeds"]]
        prompts = [{"prompt_token_ids": [int(t) for t in ids]} for ids in request["prompts"]]
        rows = sampled_rows(self.llm.generate(prompts, per_row, use_tqdm=False))
        return {"tokens": [ids for ids, _ in rows], "logprobs": [values for _, values in rows]}

    def update_weights(self, body: bytes) -> dict[str, Any]:
        from safetensors.torch import load

        tensors = load(body)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(tensors.items()),
                                                          "is_checkpoint_format": True})
        return {"tensors": len(tensors)}

    def reset_prefix_cache(self) -> dict[str, Any]:
        self.llm.reset_prefix_cache()
        return {}


def handler_for(engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # one line per request is noise during training
            pass

        def _answer(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length", 0)))

        def do_GET(self):
            if self.path == "/health":
                self._answer(200, engine.health())
            else:
                self._answer(404, {"error": f"no such path {self.path}"})

        def do_POST(self):
            routes = {
                "/generate": lambda body: engine.generate(json.loads(body)),
                "/update_weights": engine.update_weights,
                "/reset_prefix_cache": lambda body: engine.reset_prefix_cache(),
            }
            route = routes.get(self.path)
            if route is None:
                self._answer(404, {"error": f"no such path {self.path}"})
                return
            try:
                self._answer(200, route(self._body()))
            except Exception as exc:  # the client gets the reason in one line; the server keeps serving
                self._answer(400, {"error": f"{type(exc).__name__}: {exc}"})

    return Handler


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        engine = Engine(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    server = HTTPServer((args.host, args.port), handler_for(engine))
    print(f"training-wizard vllm-serve: {args.model} on http://{args.host}:{server.server_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
