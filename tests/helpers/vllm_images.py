"""A vision-language checkpoint served by vLLM (CPU) with an image: prints one JSON line (``RESULT {...}``).

Run as a script (vLLM's engine start needs the __main__ guard): ``vllm_images.py MODEL_PATH IMAGE_PATH``, with
VLLM_ENABLE_V1_MULTIPROCESSING=0. The prompt is the chat template's rendering of an image and a question, sent as
token ids with the image as ``multi_modal_data``; vLLM runs the model through its transformers backend (its own
Gemma 3 vision model imports torchvision, which has no build for this CPU torch). Two samples of 6 tokens.
"""

import json
import sys

if __name__ == "__main__":
    from PIL import Image
    from transformers import AutoProcessor
    from vllm import LLM, SamplingParams

    path, image = sys.argv[1], Image.open(sys.argv[2]).convert("RGB")
    processor = AutoProcessor.from_pretrained(path)
    turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Mia has 4 apples. How many?"}]}]
    text = processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    llm = LLM(
        model=path,
        model_impl="transformers",
        dtype="float32",
        enforce_eager=True,
        seed=0,
        max_model_len=256,
        kv_cache_memory_bytes=64 * 2**20,
        limit_mm_per_prompt={"image": 1},
    )
    params = SamplingParams(n=2, max_tokens=6, temperature=1.0, logprobs=0, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": ids, "multi_modal_data": {"image": [image]}}], params)[0]
    result = {
        "sent_ids": ids,
        "prompt_ids": list(out.prompt_token_ids),
        "tokens": [list(c.token_ids) for c in out.outputs],
        "logprobs": [[next(iter(lp.values())).logprob for lp in c.logprobs] for c in out.outputs],
    }
    print("RESULT " + json.dumps(result), flush=True)
