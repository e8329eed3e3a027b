"""TinyBERT's hidden-state loss for a pretrained student of another width and tokenizer (`distill: {student: DIR,
style: tinybert}`; Jiao et al. 2020, eq. 8-9): student layer m's hidden states, projected by a learned matrix from the
student's width to the teacher's (W_e for the embeddings' output, W_h shared by the layers), learn teacher layer
m * L_t / L_s's by MSE, beside the hinton loss on the teacher's logits.

Two tokenizers cut a text into different tokens, so a student's position is compared with a teacher's only where
both cut out the same characters (their offset mappings agree), and the first position (each model's sentence token)
with the first. Tokenizers that cut alike (WordPiece vocabularies of one origin, such as MPNet's and MiniLM's) compare
every real token; unrelated ones (byte-level BPE against WordPiece) the words both keep whole. Attention scores are
not compared: the two models attend over different tokens. The projection trains with the student and is dropped
when it is saved: the student ships as it is."""

from pathlib import Path

from edgepress.errors import ConfigError
from edgepress.models.evaluate import forward_inputs, in_precision

PROJECTION = "edgepress_projection"  # the student's submodule while it trains (its parameters join the optimizer's)


def attach_projection(student, teacher) -> object:
    """A projection from `student`'s hidden width to `teacher`'s, registered on `student` (so that the training
    loop's optimizer trains it) and returned."""
    import torch

    from edgepress.models.width import hidden_size

    width, target = hidden_size(student.config), hidden_size(teacher.config)  # a narrowed model's kept width
    projection = torch.nn.ModuleDict({"embeddings": torch.nn.Linear(width, target),
                                      "layers": torch.nn.Linear(width, target)})
    student.add_module(PROJECTION, projection)
    return projection


def save_without_projection(model, out: Path) -> None:
    """`save_pretrained` of the student, its training done (the loop saves once, at the end), as it ships: the
    projection removed, its config without hidden states (training needed them; inference and export do not)."""
    delattr(model, PROJECTION)
    model.config.output_hidden_states = False
    model.save_pretrained(out, safe_serialization=True)


def check_offsets(*tokenizers) -> None:
    """Both tokenizers say which characters each token covers (fast tokenizers' offset mappings)."""
    for words in tokenizers:
        if not getattr(words, "is_fast", False):
            raise ConfigError(f"style tinybert with a pretrained student aligns tokens by the characters they cover; "
                              f"the tokenizer {type(words).__name__} does not say which (no offset mapping). Fix: "
                              f"style hinton (the teacher's logits only)")


def aligned(student_offsets, teacher_offsets, student_mask, teacher_mask) -> tuple[list[int], list[int], list[int]]:
    """(example, student position, teacher position) of every pair of positions that cover the same characters of
    the same text (real tokens only), and of the first positions each model attends to when both are special tokens
    (their sentence tokens; on either padding side)."""
    rows, mine, theirs = [], [], []
    for b in range(len(student_offsets)):
        spans = {}
        for i, (start, end) in enumerate(teacher_offsets[b]):
            if teacher_mask[b][i] and end > start:
                spans.setdefault((int(start), int(end)), i)
        firsts = [mask.index(1) if 1 in mask else None for mask in (list(student_mask[b]), list(teacher_mask[b]))]
        special = None not in firsts and all(tuple(o[b][f]) == (0, 0) for o, f in zip(
            (student_offsets, teacher_offsets), firsts, strict=True))
        pairs = [tuple(firsts)] if special else []
        pairs += [(j, spans[(int(start), int(end))]) for j, (start, end) in enumerate(student_offsets[b])
                  if student_mask[b][j] and end > start and (int(start), int(end)) in spans]
        rows += [b] * len(pairs)
        mine += [j for j, _ in pairs]
        theirs += [i for _, i in pairs]
    return rows, mine, theirs


def projected_hidden_loss(teacher, teacher_words, student_words, texts, soft_loss, projection, cfg):
    """A `loss_fn` for the training loop: `soft_loss` (hinton on the teacher's logits) + hidden_weight * the
    projected hidden-state MSE on the aligned positions. The teacher reads the batch's texts (`texts`, by the batch's
    `index`) with its own tokenizer, alongside the student."""
    import torch
    import torch.nn.functional as F

    def loss(outputs, batch):
        device = batch["labels"].device
        chosen = [texts[i] for i in batch["index"].tolist()]
        cut = {"truncation": True, "max_length": cfg.max_length, "padding": True, "return_offsets_mapping": True,
               "return_tensors": "pt"}
        ours, theirs = student_words(chosen, **cut), teacher_words(chosen, **cut)
        if ours["input_ids"].shape != batch["input_ids"].shape:
            raise ConfigError("the student's tokenizer cut the batch's texts unlike its training batch")
        offsets = {name: encoded.pop("offset_mapping") for name, encoded in (("student", ours), ("teacher", theirs))}
        teacher.to(device)  # a no-op after the first step; the loop moved the student, not the teacher
        with torch.no_grad(), in_precision(device, cfg.targets_precision):
            taught = teacher(**forward_inputs(teacher, {k: v.to(device) for k, v in theirs.items()}),
                             output_hidden_states=True).hidden_states
        taught = [state.float() for state in taught]
        rows, mine, their = (torch.tensor(v, device=device) for v in aligned(
            offsets["student"].tolist(), offsets["teacher"].tolist(), ours["attention_mask"].tolist(),
            theirs["attention_mask"].tolist()))
        states, layers = outputs.hidden_states, len(outputs.hidden_states) - 1
        hidden = []
        for m, state in enumerate(states):
            t = taught[m * (len(taught) - 1) // layers][rows, their]  # g(m) = m * L_t / L_s, as TinyBERT maps
            project = projection["embeddings"] if m == 0 else projection["layers"]
            hidden.append(F.mse_loss(project(state[rows, mine]), t))
        return soft_loss(outputs, batch) + cfg.hidden_weight * sum(hidden) / len(hidden)

    return loss
