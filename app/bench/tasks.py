"""The three evaluation tasks: which rows, the prompt, and the standard score.

GSM8K: exact match of the final number; MMLU: accuracy of the chosen letter (zero-shot);
CNN/DailyMail: ROUGE-1/2/L F1 (the rouge-score package, with stemming).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rouge_score import rouge_scorer

from .data import read_jsonl

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_ROUGE = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)


def _number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", "").rstrip("."))
    except ValueError:
        return None


def gsm8k_score(output: str, row: dict) -> dict:
    reference = _number(row["answer"].split("####")[-1])
    predicted = _number(output)
    return {"correct": float(predicted is not None and reference is not None and abs(predicted - reference) < 1e-6)}


def mmlu_letter(output: str) -> str | None:
    """The chosen letter: 'answer is (B)' first, then a leading 'B.' / '(B)', then any lone capital A-D."""
    for pattern in (r"answer is:?\s*\(?\**([A-D])\b", r"^\s*\(?\**([A-D])[\).:\s*]", r"\b([A-D])\b"):
        match = re.search(pattern, output, flags=re.IGNORECASE if "answer" in pattern else 0)
        if match:
            return match.group(1).upper()
    return None


def mmlu_score(output: str, row: dict) -> dict:
    return {"correct": float(mmlu_letter(output) == "ABCD"[row["answer"]])}


def cnndm_score(output: str, row: dict) -> dict:
    scores = _ROUGE.score(row["highlights"], output)
    return {name: round(score.fmeasure, 4) for name, score in scores.items()}


def gsm8k_prompt(row: dict) -> str:
    return row["question"] + "\nSolve it step by step and end with the final number."


def mmlu_prompt(row: dict) -> str:
    choices = "\n".join(f"{letter}. {choice}" for letter, choice in zip("ABCD", row["choices"]))
    return (f"The following is a multiple choice question about {row['subject'].replace('_', ' ')}.\n\n"
            f"{row['question']}\n{choices}\n\nAnswer with the letter of the correct choice, then explain briefly.")


def cnndm_prompt(row: dict) -> str:
    return f"Summarize the following news article in three sentences.\n\n{row['article']}"


@dataclass(frozen=True)
class Task:
    name: str
    file: str
    prompt: Callable[[dict], str]
    score: Callable[[str, dict], dict]
    max_new_tokens: int  # default answer budget
    spread: bool = False  # sample rows evenly over the file (MMLU is sorted by subject)

    def rows(self, data_dir: Path, limit: int) -> list[dict]:
        if not self.spread:
            return read_jsonl(data_dir / self.file, limit)
        rows = read_jsonl(data_dir / self.file)
        stride = max(len(rows) // limit, 1)
        return rows[::stride][:limit]


TASKS = {
    "gsm8k": Task("gsm8k", "gsm8k_test.jsonl", gsm8k_prompt, gsm8k_score, 256),
    "mmlu": Task("mmlu", "mmlu_test.jsonl", mmlu_prompt, mmlu_score, 64, spread=True),
    "cnndm": Task("cnndm", "cnndm_test80.jsonl", cnndm_prompt, cnndm_score, 128),
}
