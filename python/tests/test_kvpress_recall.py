"""Recall of evicted tokens in kvpress's pipeline, on a tiny random Llama (skips by name without kvpress)."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the kvpress recall tests skip")
pytest.importorskip("kvpress", reason="kvpress is not installed: the kvpress recall tests skip")

import flashcache.hf as fh  # noqa: E402
from flashcache.kvpress_recall import FlashCacheRecallPress, RecallPipeline  # noqa: E402
from kvpress.utils import compute_n_kept  # noqa: E402
from tiny_model import prefill, tiny_llama  # noqa: E402


def word_tokenizer():
    """A tokenizer of 256 words "w0".."w255", one id each, built here (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(256)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="w0", eos_token="w1", bos_token="w2")


def text(ids):
    """Words after a space (kvpress puts the bos token right before the context)."""
    return "".join(f" w{int(i)}" for i in ids)


def test_the_press_archives_every_evicted_token_and_the_cache_really_shrinks():
    model = tiny_llama()
    torch.manual_seed(3)
    ids = torch.randint(0, 256, (1, 400))
    full = prefill(model, ids)
    press = FlashCacheRecallPress(compression_ratio=0.8)
    with press(model):
        cache = prefill(model, ids)
    cells = int(400 * (1 - 0.8))  # kvpress's count
    resident = cache.layers[0].keys.shape[2]
    assert resident + press.recall_budget == cells and press.recall_budget == round(cells * 0.25)  # the default share
    assert press.archive.tokens == 400 - resident
    kept = sorted(set(range(400)) - set(int(p) for p in press.archive.positions))
    for layer in range(4):  # one set for every layer and head, the rows as they were
        assert cache.layers[layer].keys.shape[2] == resident
        assert torch.equal(cache.layers[layer].keys[0], full.layers[layer].keys[0][:, kept])
        assert torch.equal(cache.layers[layer].values[0], full.layers[layer].values[0][:, kept])


def test_a_recall_brings_back_whole_blocks_within_its_budget_as_they_were():
    model = tiny_llama()
    torch.manual_seed(4)
    ids, question = torch.randint(0, 256, (1, 400)), torch.randint(0, 256, (1, 12))
    full = prefill(model, ids)
    press = FlashCacheRecallPress(compression_ratio=0.8)
    with press(model):
        cache = prefill(model, ids)
    resident = cache.layers[0].keys.shape[2]
    stats = press.recall(model, cache, question, 400)
    assert 0 < stats.recalled <= press.recall_budget and stats.blocks >= 1
    back = torch.tensor(stats.positions)
    for layer in range(4):  # the question's own keys leave no trace; the recalled rows follow the resident ones
        keys = cache.layers[layer].keys[0]
        assert keys.shape[1] == resident + stats.recalled
        assert torch.equal(keys[:, resident:], full.layers[layer].keys[0][:, back])
    assert press.archive.tokens == 400 - resident  # copied, not taken: the next question recalls afresh


def test_recalling_every_block_answers_as_the_full_cache():
    """With room for the whole archive every evicted token comes back (scores are softmax
    probabilities, all above 0): the cache is the full one in another order, and with two question
    passes greedy decoding through kvpress's pipeline gives the full cache's answer."""
    model, tokenizer = tiny_llama(), word_tokenizer()
    torch.manual_seed(5)
    context, question = text(torch.randint(3, 256, (300,))), text(torch.randint(3, 256, (10,)))
    pipe = RecallPipeline(model=model, tokenizer=tokenizer)
    full = pipe(context, question=question, max_new_tokens=12)["answer"]

    class EverythingPress(FlashCacheRecallPress):
        def _compact_and_archive(self, model, cache):
            super()._compact_and_archive(model, cache)
            self.recall_budget = self.archive.tokens

    press = EverythingPress(compression_ratio=0.75, question_passes=2)  # the question runs again over them
    assert pipe(context, question=question, press=press, max_new_tokens=12)["answer"] == full
    assert press.last.recalled == press.archive.tokens
    # Without a recall the same compression loses it (the test would pass trivially otherwise).
    without = FlashCacheRecallPress(compression_ratio=0.75, recall_share=0.0)
    assert pipe(context, question=question, press=without, max_new_tokens=12)["answer"] != full


def test_two_questions_each_recall_from_the_whole_archive():
    model, tokenizer = tiny_llama(), word_tokenizer()
    torch.manual_seed(6)
    context = text(torch.randint(3, 256, (300,)))
    questions = [text(torch.randint(3, 256, (8,))) for _ in range(2)]
    press = FlashCacheRecallPress(compression_ratio=0.75)
    pipe = RecallPipeline(model=model, tokenizer=tokenizer)
    answers = pipe(context, questions=questions, press=press, max_new_tokens=6)["answers"]
    assert len(answers) == 2
    alone = pipe(context, question=questions[1], press=press, max_new_tokens=6)["answer"]
    assert answers[1] == alone  # the first question's recall and answer left nothing behind


def test_one_question_pass_decodes_as_kvpress_and_recalls_within_its_budget():
    """question_passes=1: with no room to recall, the answer is kvpress's own (the question split
    before its last token changes nothing); with room, the blocks come back after the question's
    tokens, within the budget, and the cache is the compressed one again after the answer."""
    model, tokenizer = tiny_llama(), word_tokenizer()
    torch.manual_seed(7)
    context, question = text(torch.randint(3, 256, (300,))), text(torch.randint(3, 256, (10,)))
    pipe = RecallPipeline(model=model, tokenizer=tokenizer)
    for ratio in (0.0, 0.75):
        two = FlashCacheRecallPress(compression_ratio=ratio, recall_share=0.0, question_passes=2)
        one = FlashCacheRecallPress(compression_ratio=ratio, recall_share=0.0, question_passes=1)
        want = pipe(context, question=question, press=two, max_new_tokens=12)["answer"]
        assert pipe(context, question=question, press=one, max_new_tokens=12)["answer"] == want
    press = FlashCacheRecallPress(compression_ratio=0.75)  # one pass: the default
    assert press.question_passes == 1
    answers = pipe(context, questions=[question, question], press=press, max_new_tokens=12)["answers"]
    assert answers[0] == answers[1]  # the first question's recall left nothing behind
    assert 0 < press.last.recalled <= press.recall_budget and press.last.seconds > 0
    resident = press.last.cells - press.last.recalled  # the question's own 9 cells are not counted
    assert resident + press.recall_budget == compute_n_kept(resident + press.archive.tokens, 0.75)


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="recall_share 1.0 is outside"):
        FlashCacheRecallPress(compression_ratio=0.5, recall_share=1.0)
    with pytest.raises(ValueError, match="question_passes 3 is neither 1 nor 2"):
        FlashCacheRecallPress(compression_ratio=0.5, question_passes=3)
    with pytest.raises(ValueError, match="compression_ratio -0.1 is outside"):
        FlashCacheRecallPress(compression_ratio=-0.1)
    model = tiny_llama()
    press = FlashCacheRecallPress(compression_ratio=0.5)
    with pytest.raises(ValueError, match="a batch of 2 sequences"):
        with press(model):
            prefill(model, torch.randint(0, 256, (2, 50)))


def test_captured_queries_are_the_ones_the_attention_uses():
    """The hook's post-RoPE queries against an attention recomputed from them: the layer's output."""
    model = tiny_llama()
    torch.manual_seed(7)
    ids = torch.randint(0, 256, (1, 40))
    outputs = {}
    attn = model.model.layers[2].self_attn

    def keep_output(module, args, output):
        outputs["out"] = output[0]

    handle = attn.register_forward_hook(keep_output)
    try:
        with fh.captured_queries(model, [2]) as queries:
            cache = prefill(model, ids)
    finally:
        handle.remove()
    q = queries[2]  # [1, 4 q heads, 40, 16]
    k = cache.layers[2].keys.repeat_interleave(2, dim=1)
    v = cache.layers[2].values.repeat_interleave(2, dim=1)
    mixed = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    expect = attn.o_proj(mixed.transpose(1, 2).reshape(1, 40, -1))
    torch.testing.assert_close(outputs["out"], expect, rtol=1e-5, atol=1e-5)
