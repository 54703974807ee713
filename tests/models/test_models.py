import pytest
import torch

from rankwise.models import build_model, check_model, model_from_spec


def test_tiny_preset_is_about_a_million_parameters():
    model, spec = build_model(
        "tiny", num_labels=2, dropout=0.1, vocab_size=6000, pad_id=0, max_length=96
    )
    params = sum(p.numel() for p in model.parameters())
    assert 0.8e6 < params < 1.4e6
    rebuilt = model_from_spec(spec)
    assert sum(p.numel() for p in rebuilt.parameters()) == params


def test_local_pretrained_path_loads_offline(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=5,
    )
    BertForSequenceClassification(config).save_pretrained(tmp_path / "pretrained")
    model, spec = build_model(
        str(tmp_path / "pretrained"), num_labels=3, dropout=0.1, vocab_size=None
    )
    assert model.config.num_labels == 3  # the head is resized to this task's labels
    logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3)
    assert model_from_spec(spec).config.num_labels == 3
    # Dropout (0.1 in the saved config) is what the run asks for, in the layers themselves.
    quiet, _ = build_model(str(tmp_path / "pretrained"), num_labels=3, dropout=0.0, vocab_size=None)
    rates = {m.p for m in quiet.modules() if isinstance(m, torch.nn.Dropout)}
    assert rates == {0.0}, rates
    assert {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} == {0.1}


def test_check_model_refuses_what_cannot_train_before_launch(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    check_model("tiny", reads_text=True, max_length=96)
    check_model("linear", reads_text=False, max_length=96)
    with pytest.raises(ValueError, match="reads text: use --model linear or mlp"):
        check_model("tiny", reads_text=False, max_length=96)
    with pytest.raises(ValueError, match="reads feature vectors"):
        check_model("mlp", reads_text=True, max_length=96)
    with pytest.raises(ValueError, match="'tinyy': not a preset"):
        check_model("tinyy", reads_text=True, max_length=96)
    config = BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    BertForSequenceClassification(config).save_pretrained(tmp_path / "pretrained")
    check_model(str(tmp_path / "pretrained"), reads_text=True, max_length=32)
    with pytest.raises(ValueError, match="max_position_embeddings=32"):
        check_model(str(tmp_path / "pretrained"), reads_text=True, max_length=64)


def test_toy_models_and_wrong_pairings():
    linear, _ = build_model("linear", num_labels=5, dropout=0.0, features=10)
    assert linear(features=torch.randn(4, 10)).shape == (4, 5)
    with pytest.raises(ValueError, match="needs feature inputs"):
        build_model("mlp", num_labels=5, dropout=0.0)
    with pytest.raises(ValueError, match="reads text"):
        build_model("tiny", num_labels=2, dropout=0.0, features=10)
    with pytest.raises(ValueError, match="not a preset"):
        build_model("/no/such/model", num_labels=2, dropout=0.0, vocab_size=10)


def test_split_devices_mlp_matches_the_unsplit_one():
    torch.manual_seed(0)
    whole, spec = build_model("mlp", num_labels=5, dropout=0.0, features=10)
    split, _ = build_model(
        "mlp", num_labels=5, dropout=0.0, features=10, split_devices=True, local_rank=1
    )
    split.load_state_dict(whole.state_dict())
    x = torch.randn(8, 10)
    assert torch.allclose(whole(features=x), split(features=x))


def test_mean_pooling_ignores_padding_and_survives_the_spec(tmp_path):
    from rankwise.models.bert import MeanPooledBert

    torch.manual_seed(0)
    model, spec = build_model(
        "tiny", num_labels=3, dropout=0.0, vocab_size=100, pad_id=0, max_length=16, pooling="mean"
    )
    assert isinstance(model, MeanPooledBert) and spec["pooling"] == "mean"
    model.eval()
    ids = torch.tensor([[5, 6, 7]])
    padded = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 0, 0, 0]])
    mask = (padded != 0).long()
    with torch.no_grad():
        alone = model(input_ids=ids)
        batched = model(input_ids=padded, attention_mask=mask)
    assert batched.shape == (2, 3)
    assert torch.allclose(alone[0], batched[0], atol=1e-5)  # padding changes nothing
    rebuilt = model_from_spec(spec)
    assert isinstance(rebuilt, MeanPooledBert)
    rebuilt.load_state_dict(model.state_dict())  # strict: same architecture


def test_mean_pooling_is_refused_for_a_pretrained_head(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    BertForSequenceClassification(config).save_pretrained(tmp_path / "pretrained")
    with pytest.raises(ValueError, match="model.pooling=cls"):
        build_model(str(tmp_path / "pretrained"), num_labels=2, dropout=0.1, pooling="mean")


def test_wide_and_deep_adds_an_ngram_bag_to_the_transformer():
    from rankwise.models.bert import WideAndDeepBert

    torch.manual_seed(0)
    model, spec = build_model(
        "tiny",
        num_labels=2,
        dropout=0.0,
        vocab_size=100,
        pad_id=0,
        max_length=16,
        ngrams={"n": 3, "buckets": 64},
    )
    assert isinstance(model, WideAndDeepBert) and spec["ngrams"] == {"n": 3, "buckets": 64}
    assert sum(p.numel() for p in model.ngrams.parameters()) == 64 * 2
    model.eval()
    ids, mask = torch.tensor([[1, 5, 6, 2]]), torch.ones(1, 4, dtype=torch.long)
    grams = torch.tensor([[3, 7, 7, 9]])
    with torch.no_grad():
        deep = model.bert(input_ids=ids, attention_mask=mask).logits
        # zero-initialised: the transformer alone
        assert torch.equal(model(ids, mask, ngram_ids=grams), deep)
        model.ngrams.weight.normal_()
        # the padding row, as training keeps it (it never gets a gradient)
        model.ngrams.weight[0] = 0
        with_grams = model(ids, mask, ngram_ids=grams)
        padded = model(ids, mask, ngram_ids=torch.tensor([[3, 7, 7, 9, 0, 0]]))
    assert not torch.allclose(with_grams, deep)
    assert torch.allclose(with_grams, padded)  # padding id 0 adds nothing and does not count
    # sum / sqrt(4 n-grams) x lr scale
    expected = deep + model.ngrams.weight[[3, 7, 7, 9]].sum(0) / 2 * 10.0
    assert torch.allclose(with_grams, expected, atol=1e-6)
    with pytest.raises(ValueError, match="ngram_ids"):
        model(ids, mask)
    rebuilt = model_from_spec(spec)
    rebuilt.load_state_dict(model.state_dict())  # strict: the same architecture from the spec
