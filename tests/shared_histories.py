"""Histories that more than one test module replays (found by hypothesis or by CI)."""

from __future__ import annotations

from typing import Any


def early_turns() -> list[dict[str, Any]]:
    """A turn of tool calls of several shapes, then a short one with a reasoning id that
    repeats (the history hypothesis found: ``test_masking_properties``)."""
    done = {"type": "message", "role": "assistant", "status": "completed"}
    return [
        {"role": "user", "content": ""},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
        {
            "type": "computer_call",
            "id": "cu_1",
            "call_id": "cu1",
            "action": {"type": "screenshot"},
            "pending_safety_checks": [],
            "status": "completed",
        },
        {
            "type": "computer_call_output",
            "call_id": "cu1",
            "output": {"type": "computer_screenshot", "image_url": "https://example.com/s.png"},
        },
        {
            "type": "local_shell_call",
            "id": "lshm_2",
            "call_id": "ml2",
            "action": {"type": "exec", "command": ["ls"], "env": {}},
            "status": "completed",
        },
        {"type": "local_shell_call_output", "call_id": "ml2", "output": "out line of output 7\n"},
        {
            "type": "apply_patch_call",
            "call_id": "ap3",
            "status": "completed",
            "operation": {"type": "delete_file", "path": "x"},
        },
        {
            "type": "apply_patch_call_output",
            "call_id": "ap3",
            "status": "completed",
            "output": "done",
        },
        {"type": "reasoning", "id": "rs_dup", "summary": [], "encrypted_content": "gAAA"},
        {
            **done,
            "id": "msg_4",
            "content": [{"type": "output_text", "text": "", "annotations": []}],
        },
        {"role": "user", "content": ""},
        {"type": "reasoning", "id": "rs_dup", "summary": [], "encrypted_content": "gAAA"},
        {
            **done,
            "id": "msg_4b",
            "content": [{"type": "output_text", "text": "", "annotations": []}],
        },
    ]
