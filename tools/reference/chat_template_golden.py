#!/usr/bin/env python3
"""Golden renderings of aerie's chat templates (tests/fixtures/chat_templates/<template>.json).

    pip install transformers tokenizers jinja2      # for this generator only; aerie never needs them
    python3 tools/reference/chat_template_golden.py [--only NAME[,NAME...]] [DATA_DIR] [OUT_DIR]

DATA_DIR defaults to ../shared/data beside the checkout, OUT_DIR to tests/fixtures/chat_templates.

For every template of configs/templates/ this renders a fixed set of conversations (CONVERSATIONS below: single
turn, multi-turn, system prompt, tool call + tool result, parallel tool calls, reasoning_content, unicode,
whitespace) with transformers' apply_chat_template and the model publisher's REAL Jinja template (from
DATA_DIR/tokenizers/*/tokenizer_config*.json, DATA_DIR/chat-templates/llama.cpp/*.jinja or
DATA_DIR/tokenizers/mistral/chat_templates/*.jinja; "chatml" is the ChatML template of the transformers
documentation), and writes per case:
  record  the conversation as one OpenAI-format JSONL record, exactly as aerie's prepare reads it
  text    the rendered text (add_generation_prompt=False: training data ends with the last message)
  spans   [begin, end) UTF-8 byte offsets of the text the loss mask covers: for every assistant message, from
          the end of its role header to the end of the end-of-turn token that closes it (eagle3.md section 1).
          The spans are found in the rendered text by locating each assistant message's first generated
          text (its content, else its first tool call's name) and taking the last assistant header before
          it; the span ends after the next end-of-turn token or at the next non-assistant turn start,
          whichever comes first. Qwen3 without thinking: the empty think block "<think>\\n\\n</think>\\n\\n"
          belongs to the prompt (the server puts it into the generation prompt), so it is skipped.
  ids     (byte-level templates only) apply_chat_template(tokenize=True) with the model's tokenizer.json;
          for Kimi-K2 (tiktoken.model) tiktoken's ids of the text (kimi_tokenizer_golden.py, pip install tiktoken)
  mask    (with ids) 1 on every token whose character range meets a span, from the tokenizer's offsets
  prompt_record, prompt_text   the conversation without its last assistant message, rendered with
          add_generation_prompt=True (the prompt a server gives the model for that turn)
Cases a template refuses (its Jinja raises, e.g. Llama 3.1 with two tool calls) are listed under "refused".

Deliberate differences from the Jinja (not rendered here, documented in docs/preparing-data.md):
  * deepseek-v3 with exactly one tool call in a message: the Jinja leaves the call list unclosed (no
    <|tool_calls_end|>, no EOS); aerie closes it. The case "tool_call" is therefore not a golden for it.
    Its tool-call cases are rendered from the compiled template directly: apply_chat_template (transformers 5)
    drops None-valued keys, and this Jinja renders tool calls only for content = None.
  * kimi-k2-thinking: the conversation's final answer (its last assistant message, without tool calls) keeps
    its reasoning, <think>REASONING</think>ANSWER, as the model writes it after the generation prompt; the
    Jinja (a finished conversation's history) renders it with an empty <think></think>, and in front of a
    think block the content already holds (an answer of aerie generate) a second one. The Jinja's text is
    rendered, then its last empty think block is filled with reasoning_content, or dropped where the content
    starts with its own <think> (kimi_final_answer below); the cases "reasoning" and "reasoning_inline".
  * mistral-v3: tool results that are JSON are embedded as JSON and tool-call arguments re-serialised, as
    mistral-common does (its goldens give the exact ids); v3_spm.jinja keeps both verbatim. The case
    "parallel_tool_calls" (JSON results) is therefore not a golden for it.
Mistral: mistral-common tokenizes every message on its own with sentencepiece's dummy prefix, which is what
aerie does; the ids golden for Mistral is mistral-common's own (DATA_DIR/tokenizers/mistral/samples), read by
the C++ test directly. The text here is the Jinja's, whose spaces stand for the dummy prefixes.
"""
import copy
import json
import os
import sys

from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DATA = None  # main() sets it

# The ChatML template as the transformers documentation gives it (chat_templating.md).
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}]


def call(cid, city):
    return {"id": cid, "type": "function", "function": {"name": "get_weather",
                                                         "arguments": {"city": city, "unit": "celsius"}}}


CONVERSATIONS = {
    "single": {"messages": [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."}]},
    "multi_turn": {"messages": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Give me two prime numbers."},
        {"role": "assistant", "content": "2 and 3."},
        {"role": "user", "content": "And their sum?"},
        {"role": "assistant", "content": "2 + 3 = 5."}]},
    "system": {"messages": [
        {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
        {"role": "assistant", "content": "Air molecules scatter blue light more than red light."},
        {"role": "user", "content": "And sunsets?"},
        {"role": "assistant", "content": "At sunset the light crosses more air, so the blue is scattered away."}]},
    "tool_call": {"tools": TOOLS, "messages": [
        {"role": "system", "content": "You can look up the weather."},
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call("call00001", "Paris")]},
        {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "22"},
        {"role": "assistant", "content": "It is 22 degrees Celsius in Paris."}]},
    "parallel_tool_calls": {"tools": TOOLS, "messages": [
        {"role": "user", "content": "Compare the weather in Oslo and Rome."},
        {"role": "assistant", "content": "", "tool_calls": [call("call00002", "Oslo"), call("call00003", "Rome")]},
        {"role": "tool", "tool_call_id": "call00002", "name": "get_weather", "content": "{\"temp\": -3}"},
        {"role": "tool", "tool_call_id": "call00003", "name": "get_weather", "content": "{\"temp\": 18}"},
        {"role": "assistant", "content": "Rome is 21 degrees warmer than Oslo."},
        {"role": "user", "content": "Thanks."},
        {"role": "assistant", "content": "You're welcome!"}]},
    "reasoning": {"messages": [
        {"role": "user", "content": "What is 17 * 3?"},
        {"role": "assistant", "reasoning_content": "17 * 3 = 51.", "content": "51"},
        {"role": "user", "content": "And 51 + 9?"},
        {"role": "assistant", "reasoning_content": "51 + 9 = 60.\nDouble-check: 60 - 9 = 51.", "content": "60"}]},
    "reasoning_inline": {"messages": [
        {"role": "user", "content": "Is 7 prime?"},
        {"role": "assistant", "content": "<think>\n7 has no divisors but 1 and 7.\n</think>\n\nYes, 7 is prime."}]},
    "unicode": {"messages": [
        {"role": "user", "content": "Traduis « bonjour » en japonais, s'il te plaît ☕ 你好"},
        {"role": "assistant", "content": "「こんにちは」です 😀 — Grüße, naïve café ✓"}]},
    "whitespace": {"messages": [
        {"role": "user", "content": "  Two spaces before, newline after\n"},
        {"role": "assistant", "content": "Line one\n\nLine two  "},
        {"role": "user", "content": "tabs\there"},
        {"role": "assistant", "content": "ok"}]},
}

# name -> how to render: tokenizer folder (byte-level ids) or None, template source, special tokens, kwargs,
# assistant headers (the span starts after one), end-of-turn tokens, other turn starts (a span stops there).
TEMPLATES = {
    "llama3": dict(tokenizer="tokenizers/llama3",
                   config="tokenizers/llama3/tokenizer_config.Meta-Llama-3-8B-Instruct.ml-energy.json",
                   headers=["<|start_header_id|>assistant<|end_header_id|>\n\n"], eot=["<|eot_id|>"]),
    "llama3.1": dict(tokenizer="tokenizers/llama3", config="tokenizers/llama3.1/tokenizer_config.json",
                     headers=["<|start_header_id|>assistant<|end_header_id|>\n\n"], eot=["<|eot_id|>", "<|eom_id|>"]),
    "qwen2.5": dict(tokenizer="tokenizers/qwen3", config="tokenizers/qwen3/tokenizer_config.json",
                    jinja="chat-templates/llama.cpp/Qwen-Qwen2.5-7B-Instruct.jinja",
                    headers=["<|im_start|>assistant\n"], eot=["<|im_end|>"]),
    "qwen3": dict(tokenizer="tokenizers/qwen3", config="tokenizers/qwen3/tokenizer_config.json",
                  headers=["<|im_start|>assistant\n"], eot=["<|im_end|>"]),
    "qwen3-nothink": dict(tokenizer="tokenizers/qwen3", config="tokenizers/qwen3/tokenizer_config.json",
                          kwargs={"enable_thinking": False}, skip_after_header="<think>\n\n</think>\n\n",
                          headers=["<|im_start|>assistant\n"], eot=["<|im_end|>"]),
    "chatml": dict(tokenizer="tokenizers/qwen3", config="tokenizers/qwen3/tokenizer_config.json", template=CHATML,
                   headers=["<|im_start|>assistant\n"], eot=["<|im_end|>"]),
    "deepseek-v3": dict(tokenizer="tokenizers/deepseek-v3", config="tokenizers/deepseek-v3/tokenizer_config.json",
                        headers=["<\uff5cAssistant\uff5c>", "<\uff5ctool\u2581outputs\u2581end\uff5c>"],
                        eot=["<\uff5cend\u2581of\u2581sentence\uff5c>"],
                        stops=["<\uff5cUser\uff5c>", "<\uff5ctool\u2581outputs\u2581begin\uff5c>"],
                        keep_none=True,
                        not_golden={"tool_call": "the Jinja leaves a single tool call unclosed; aerie closes it"}),
    "mistral-v1": dict(jinja="tokenizers/mistral/chat_templates/v1_spm.jinja", bos="<s>", eos="</s>",
                       headers=[" [/INST]"], eot=["</s>"], stops=[" [INST]"]),
    "mistral-v3": dict(jinja="tokenizers/mistral/chat_templates/v3_spm.jinja", bos="<s>", eos="</s>",
                       headers=["[/INST]", "[/TOOL_RESULTS]"], eot=["</s>"], stops=["[INST]", "[TOOL_RESULTS]"],
                       not_golden={"parallel_tool_calls": "mistral-common embeds a JSON tool result as JSON (its own "
                                   "goldens, which aerie follows); v3_spm.jinja keeps it a string"}),
}
TEMPLATES["mistral"] = TEMPLATES["mistral-v3"]
# Kimi-K2 (tiktoken.model, no tokenizer.json): ids from tiktoken as kimi_tokenizer_golden.py sets it up, token
# offsets from the tokens' bytes. Tools are deep-sorted before rendering, as tokenization_kimi.py's
# apply_chat_template does (the record keeps them as given).
for _name, _jinja in (("kimi-k2", "chat_template.kimi-k2-instruct.jinja"),
                      ("kimi-k2-thinking", "chat_template.kimi-k2-thinking.jinja")):
    TEMPLATES[_name] = dict(tiktoken="tokenizers/kimi-k2", jinja="tokenizers/kimi-k2/" + _jinja, sort_tools=True,
                            headers=["<|im_assistant|>assistant<|im_middle|>"], eot=["<|im_end|>"])
TEMPLATES["kimi-k2-thinking"]["final_answer_reasoning"] = True
# SmolLM2-135M-Instruct as tools/get_smollm2 converts it (the real chat model of the pipeline test): its
# tokenizer.json and tokenizer_config.json (chat template from the GGUF) in $AERIE_CACHE/SmolLM2-135M-Instruct
# ($AERIE_CACHE default ~/.cache/aerie). Skipped when absent; the fixture names it "cache:<folder>".
CACHE = os.environ.get("AERIE_CACHE", os.path.expanduser("~/.cache/aerie"))
TEMPLATES["smollm2"] = dict(tokenizer=os.path.join(CACHE, "SmolLM2-135M-Instruct"), tokenizer_name="cache:SmolLM2-135M-Instruct",
                            config=os.path.join(CACHE, "SmolLM2-135M-Instruct", "tokenizer_config.json"),
                            headers=["<|im_start|>assistant\n"], eot=["<|im_end|>"])


def config_token(cfg, key):
    v = cfg.get(key)
    return v.get("content") if isinstance(v, dict) else v


def load(data, spec):
    """(tokenizer or None, chat template string, bos, eos)."""
    cfg = json.load(open(os.path.join(data, spec["config"]), encoding="utf-8")) if "config" in spec else {}
    template = spec.get("template") or cfg.get("chat_template")
    if "jinja" in spec:
        template = open(os.path.join(data, spec["jinja"]), encoding="utf-8").read()
    bos = spec.get("bos", config_token(cfg, "bos_token"))
    eos = spec.get("eos", config_token(cfg, "eos_token"))
    tok = None
    if spec.get("tiktoken"):
        bos = eos = None  # the Kimi templates use neither
    if spec.get("tokenizer"):
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(data, spec["tokenizer"], "tokenizer.json"))
    else:  # text only: any tokenizer object carries the template; tokenization is never asked of it
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(data, "tokenizers/llama3/tokenizer.json"))
    if bos:
        tok.bos_token = bos
    if eos:
        tok.eos_token = eos
    return tok, template


def for_template(name, conv):
    """The conversation as this template's Jinja wants it (DeepSeek-V3 concatenates string arguments and
    renders tool calls only when content is null)."""
    conv = copy.deepcopy(conv)
    if name.startswith("deepseek") or name.startswith("mistral"):
        for m in conv["messages"]:
            for c in m.get("tool_calls", []):
                c["function"]["arguments"] = json.dumps(c["function"]["arguments"], ensure_ascii=False)
            if m.get("tool_calls") and name.startswith("deepseek"):
                m["content"] = None
    return conv


def render_text(spec, tok, template, conv, args):
    """apply_chat_template(tokenize=False); for DeepSeek-V3 the compiled template is rendered directly, because
    apply_chat_template drops None-valued keys (transformers 5) and that Jinja needs content = None to render
    tool calls."""
    if not spec.get("keep_none"):
        return tok.apply_chat_template(conv["messages"], tokenize=False, **args)
    from transformers.utils.chat_template_utils import _compile_jinja_template
    args = {k: v for k, v in args.items() if k != "chat_template"}
    return _compile_jinja_template(template).render(messages=conv["messages"], bos_token=tok.bos_token,
                                                    eos_token=tok.eos_token, **args)


def kimi_final_answer(text, conv):
    """kimi-k2-thinking's deliberate difference (module docstring): the final answer's think block."""
    last = conv["messages"][-1]
    if last["role"] != "assistant" or last.get("tool_calls"):
        return text
    empty = "<|im_assistant|>assistant<|im_middle|><think></think>"
    at = text.rfind(empty)
    assert at >= 0, "no empty think block in the final answer"
    head, tail = text[:at] + "<|im_assistant|>assistant<|im_middle|>", text[at + len(empty):]
    content = last.get("content") or ""
    if last.get("reasoning_content") is not None:
        return head + "<think>" + last["reasoning_content"] + "</think>" + tail
    if content.startswith("<think>") and "</think>" in content:
        return head + tail
    return text


def first_generated(m):
    content = m.get("content") or ""
    if "</think>" in content:
        content = content.split("</think>")[-1]
    if content.strip():
        return content.strip()[:12]
    if m.get("tool_calls"):
        return m["tool_calls"][0]["function"]["name"]
    return None


def spans_of(text, conv, spec):
    spans, cursor = [], 0
    for m in conv["messages"]:
        if m["role"] != "assistant":
            continue
        anchor = first_generated(m)
        # the first assistant header after the cursor: tool definitions (Llama 3.1 puts them into the first
        # user message) must not be taken for a tool call
        hpos = min((p for p in (text.find(h, cursor) for h in spec["headers"]) if p >= 0), default=cursor)
        if anchor is not None and text.find(anchor, hpos) < 0 and m.get("tool_calls") and not m.get("content"):
            anchor = None  # a template that drops tool calls (Llama 3, ChatML): an empty turn
        if anchor is None:  # empty assistant message: the span is its header's end .. end of turn
            pos = min((p for p in (text.find(h, cursor) for h in spec["headers"]) if p >= 0), default=-1)
            assert pos >= 0, "no assistant header after %d" % cursor
            hdr = next(h for h in spec["headers"] if text.startswith(h, pos))
            start = pos + len(hdr)
            at = start
        else:
            at = text.find(anchor, hpos)
            assert at >= 0, "assistant text %r not found after %d" % (anchor, cursor)
            best = max(((text.rfind(h, cursor, at), h) for h in spec["headers"]), key=lambda x: x[0])
            assert best[0] >= 0, "no assistant header before %r" % anchor
            start = best[0] + len(best[1])
        skip = spec.get("skip_after_header")
        if skip and text.startswith(skip, start):
            start += len(skip)
        # from the header's end: an anchor found past the turn (Kimi-K2-Thinking's tool-call turn writes the
        # call id, not the name, and the name is the header of the tool result after it) cannot stretch it
        ends = [text.find(e, start) + len(e) for e in spec["eot"] if text.find(e, start) >= 0]
        ends += [text.find(s, start) for s in spec.get("stops", []) if text.find(s, start) >= 0]
        end = min(ends) if ends else len(text)
        spans.append((start, end))
        cursor = end
    return spans


def byte_offset(text, i):
    return len(text[:i].encode("utf-8"))


def render_case(name, spec, tok, template, conv):
    conv = for_template(name, conv)
    kwargs = dict(spec.get("kwargs", {}))
    args = dict(chat_template=template, add_generation_prompt=False, **kwargs)
    if conv.get("tools"):
        args["tools"] = deep_sort(conv["tools"]) if spec.get("sort_tools") else conv["tools"]
    text = render_text(spec, tok, template, conv, args)
    if spec.get("final_answer_reasoning"):
        text = kimi_final_answer(text, conv)
    spans = spans_of(text, conv, spec)
    case = {"record": json.dumps(conv, ensure_ascii=False), "text": text,
            "spans": [[byte_offset(text, a), byte_offset(text, b)] for a, b in spans]}
    # The generation prompt of the last assistant turn: the conversation before it, add_generation_prompt=True
    # (what a server, and aerie generate, feed the model).
    if conv["messages"][-1]["role"] == "assistant":
        pconv = dict(conv, messages=conv["messages"][:-1])
        try:
            case["prompt_record"] = json.dumps(pconv, ensure_ascii=False)
            case["prompt_text"] = render_text(spec, tok, template, pconv, dict(args, add_generation_prompt=True))
        except Exception:
            case.pop("prompt_record", None)
    if spec.get("tiktoken"):
        case["ids"], case["mask"] = tiktoken_ids_and_mask(spec, text, case["spans"])
    if spec.get("tokenizer"):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        if not spec.get("keep_none"):
            out = tok.apply_chat_template(conv["messages"], tokenize=True, return_dict=True, **args)
            assert list(out["input_ids"]) == ids, "apply_chat_template ids differ from tokenizing its text"
        mask = []
        for a, b in enc["offset_mapping"]:
            mask.append(int(any(a < e and b > s for s, e in spans)))
        case["ids"] = ids
        case["mask"] = mask
    return case


def deep_sort(obj):
    """tokenization_kimi.py deep_sort_dict: dict keys sorted at every level."""
    if isinstance(obj, dict):
        return {k: deep_sort(v) for k, v in sorted(obj.items())}
    if isinstance(obj, list):
        return [deep_sort(v) for v in obj]
    return obj


_TIKTOKEN = {}


def tiktoken_ids_and_mask(spec, text, byte_spans):
    """Ids of `text` from tiktoken (kimi_tokenizer_golden.py's encoding) and the mask of the tokens whose byte
    range meets a span."""
    if spec["tiktoken"] not in _TIKTOKEN:
        sys.path.insert(0, HERE)
        from kimi_tokenizer_golden import kimi_encoding
        _TIKTOKEN[spec["tiktoken"]] = kimi_encoding(os.path.join(DATA, spec["tiktoken"]))
    enc, encode = _TIKTOKEN[spec["tiktoken"]][:2]
    ids = encode(text)
    assert enc.decode(ids) == text, "tiktoken does not give the text back"
    mask, pos = [], 0
    for i in ids:
        n = len(enc.decode_single_token_bytes(i))
        mask.append(int(any(pos < e and pos + n > s for s, e in byte_spans)))
        pos += n
    return ids, mask


def main(argv):
    global DATA
    only = None
    if len(argv) > 2 and argv[1] == "--only":  # --only NAME[,NAME]: just these templates
        only, argv = argv[2].split(","), [argv[0]] + argv[3:]
    data = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(REPO), "shared", "data")
    DATA = data
    out_dir = argv[2] if len(argv) > 2 else os.path.join(REPO, "tests", "fixtures", "chat_templates")
    os.makedirs(out_dir, exist_ok=True)
    for name, spec in TEMPLATES.items():
        if only and name not in only:
            continue
        if spec.get("tokenizer") and not os.path.exists(os.path.join(data, spec["tokenizer"], "tokenizer.json")):
            print("%-14s skipped: no %s" % (name, os.path.join(data, spec["tokenizer"])))
            continue
        tok, template = load(data, spec)
        cases, refused = {}, {}
        for cname, conv in CONVERSATIONS.items():
            if cname in spec.get("not_golden", {}):
                refused[cname] = "not a golden: " + spec["not_golden"][cname]
                continue
            try:
                cases[cname] = render_case(name, spec, tok, template, conv)
            except Exception as e:  # the template's own raise_exception, or a type error in its Jinja
                if isinstance(e, AssertionError):
                    raise
                refused[cname] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        source = spec.get("jinja") or spec.get("config") or "transformers docs ChatML"
        if name == "smollm2":
            source = "tokenizer_config.json of SmolLM2-135M-Instruct (tools/get_smollm2)"
        fixture = {"template": name, "source": source,
                   "tokenizer": spec.get("tokenizer_name", spec.get("tokenizer") or spec.get("tiktoken")), "cases": cases, "refused": refused}
        path = os.path.join(out_dir, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(fixture, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print("%-14s %d cases, refused: %s" % (name, len(cases), ", ".join(sorted(refused)) or "-"))


if __name__ == "__main__":
    main(sys.argv)
