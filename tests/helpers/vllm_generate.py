"""Load checkpoints in vLLM (CPU) and generate: prints one JSON line per checkpoint with its outputs.

Run as a script (vLLM's engine start needs the __main__ guard): ``vllm_generate.py PATH [PATH ...]``; the
checkpoints load one after another in this process (set VLLM_ENABLE_V1_MULTIPROCESSING=0 to keep the engine in
it too). Used by the tests.
"""

import gc
import json
import sys

if __name__ == "__main__":
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    for path in sys.argv[1:]:
        tok = AutoTokenizer.from_pretrained(path)
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "Mia has 4 apples. How many?"}], add_generation_prompt=True, tokenize=False
        )
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        llm = LLM(
            model=path, gpu_memory_utilization=0.1, dtype="float32", enforce_eager=True, seed=0, max_model_len=256
        )
        out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(n=2, max_tokens=8, temperature=1.0, logprobs=0))
        comps = out[0].outputs
        result = {
            "path": path,
            "token_ids": [list(c.token_ids) for c in comps],
            "logprobs": [[next(iter(lp.values())).logprob for lp in c.logprobs] for c in comps],
        }
        print("RESULT " + json.dumps(result), flush=True)
        del llm
        gc.collect()
