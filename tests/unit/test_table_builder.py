"""Rows to Arrow in bounded pieces (rig.results.TableBuilder): the same table as pyarrow's from_pylist."""

import pyarrow as pa
import pytest

from rig.results import PIECE_ROWS_SCALAR, REQUEST_SCHEMA, PartWriter, TableBuilder, empty_record, read_requests


def _rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        r = {
            **empty_record(),
            "request_id": f"r{i}",
            "status": "ok" if i % 3 else "failed",
            "ok": bool(i % 3),
            "ttft_s": 0.001 * i if i % 5 else None,
            "chunk_offsets_s": [0.01 * k for k in range(i % 4)],
            "chunk_tokens": [1] * (i % 4),
            "completion_tokens": i % 7 or None,
            "error": None if i % 3 else "x",
        }
        if i % 11 == 0:
            del r["finish_reason"]  # a missing key is null, as from_pylist makes it
        rows.append(r)
    return rows


@pytest.mark.parametrize("n", [1, 7, PIECE_ROWS_SCALAR + 3])
def test_the_table_equals_from_pylist(n):
    rows = _rows(n)
    b = TableBuilder(rows, REQUEST_SCHEMA)
    steps = 0
    while not b.done:
        b.step()
        steps += 1
    assert steps >= len(REQUEST_SCHEMA)  # at least one piece per column: each step is one column, some rows
    got = b.table()
    want = pa.Table.from_pylist(rows, schema=REQUEST_SCHEMA)
    assert got.schema == want.schema and got.num_rows == n
    assert got.to_pylist() == want.to_pylist()


def test_a_table_before_the_last_piece_is_refused():
    b = TableBuilder(_rows(3), REQUEST_SCHEMA)
    b.step()
    with pytest.raises(AssertionError):
        b.table()
    assert b.build().num_rows == 3


def test_the_part_writer_writes_what_the_builder_built(tmp_path):
    w = PartWriter(tmp_path / "requests" / "point=p0" / "gen=0", REQUEST_SCHEMA)
    rows = _rows(40)
    for r in rows:
        w.add(r)
    w.close()
    got = read_requests(tmp_path).sort_by("request_id").to_pylist()
    want = pa.Table.from_pylist(rows, schema=REQUEST_SCHEMA).sort_by("request_id").to_pylist()
    assert got == want and w.rows_written == 40


def test_a_piece_that_does_not_convert_has_its_bad_row_repaired_and_the_rest_kept():
    from rig.contracts import repair_record

    rows = _rows(PIECE_ROWS_SCALAR + 5)
    rows[PIECE_ROWS_SCALAR + 2]["prompt_tokens"] = "many"  # in the second piece of its column
    repaired = []
    b = TableBuilder(rows, REQUEST_SCHEMA, repair=lambda row: repaired.append(repair_record(row)))
    got = b.build()
    assert len(repaired) == 1 and "prompt_tokens='many' is not int64" in repaired[0]
    bad = got.slice(PIECE_ROWS_SCALAR + 2, 1).to_pylist()[0]
    assert bad["status"] == "failed" and bad["prompt_tokens"] is None and bad["ok"] is False
    assert got.to_pylist() == pa.Table.from_pylist(rows, schema=REQUEST_SCHEMA).to_pylist()  # the repaired rows


def test_a_repair_that_does_not_fix_the_row_raises_instead_of_looping():
    rows = _rows(3)
    rows[1]["ttft_s"] = "soon"
    b = TableBuilder(rows, REQUEST_SCHEMA, repair=lambda row: None)
    with pytest.raises((TypeError, ValueError, pa.ArrowException)):
        b.build()
    with pytest.raises((TypeError, ValueError, pa.ArrowException)):  # and without a repair, the error itself
        TableBuilder(rows, REQUEST_SCHEMA).build()
