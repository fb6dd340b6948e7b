"""The tenants file and the limits each tenant is held to (no server: a clock the test moves)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonbundle.errors import ConfigError
from tritonbundle.gateway.tenants import Admission, Limits, Refused, Tenant, TooLarge, key_hash, load, parse

KEY_A, KEY_B = "a-key-of-tenant-a-0001", "b-key-of-tenant-b-0002"


def test_a_tenants_file_maps_hashed_and_plain_keys_to_tenants(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(f"""
tenants:
  - name: search
    keys: ["{key_hash(KEY_A)}"]
    models: [minilm]
    limits: {{requests_per_s: 20, burst: 40, tokens_per_min: 1000, concurrent_requests: 4}}
  - name: ads
    keys: ["{KEY_B}"]
""")
    tenants = load(path)
    search = tenants.find(KEY_A)
    assert search is not None and search.name == "search" and search.may_use("minilm") and not search.may_use("other")
    assert search.limits == Limits(20.0, 40.0, 1000, 4)
    ads = tenants.find(KEY_B)
    assert ads is not None and ads.may_use("anything") and tenants.plain_keys == 1
    assert tenants.find("not-a-key-at-all-000") is None and tenants.find(key_hash(KEY_A)) is None
    assert KEY_B not in repr(tenants), "only hashes are kept"
    assert tenants.unserved(["minilm"]) == []
    (line,) = tenants.unserved(["bert"])
    assert line.startswith("tenant 'search' may use ['minilm'], which this gateway's OpenAI API does not serve")


@pytest.mark.parametrize(("data", "words"), [
    ({}, "non-empty list 'tenants'"),
    ({"tenants": [{"name": "a b", "keys": [KEY_A]}]}, r"tenants\[0\].name: 'a b'"),
    ({"tenants": [{"name": "a", "keys": []}]}, r"tenants\[0\].keys: expected a non-empty list"),
    ({"tenants": [{"name": "a", "keys": ["short"]}]}, r"tenants\[0\].keys\[0\]: a plain key needs at least 16"),
    ({"tenants": [{"name": "a", "keys": ["sha256:abc"]}]}, r"keys\[0\]: a sha256: key needs 64"),
    ({"tenants": [{"name": "a", "keys": [KEY_A]}, {"name": "b", "keys": [key_hash(KEY_A)]}]},
     r"tenants\[1\].keys\[0\]: the same key is also a key of tenant 'a'"),
    ({"tenants": [{"name": "a", "keys": [KEY_A]}, {"name": "a", "keys": [KEY_B]}]}, r"tenants\[1\].name: 'a' is used twice"),
    ({"tenants": [{"name": "a", "keys": [KEY_A], "limits": {"requests_per_s": 0}}]}, r"limits.requests_per_s: must be a number > 0"),
    ({"tenants": [{"name": "a", "keys": [KEY_A], "limits": {"rps": 3}}]}, r"limits: unknown keys \['rps'\]"),
    ({"tenants": [{"name": "a", "keys": [KEY_A], "limits": {"burst": 3}}]}, r"limits.burst: needs requests_per_s"),
    ({"tenants": [{"name": "a", "keys": [KEY_A], "limits": {"requests_per_s": 1, "burst": 0.5}}]},
     r"limits.burst: must be at least 1 \(requests at once\), not 0.5"),
    ({"tenants": [{"name": "a", "keys": [KEY_A], "quota": 3}]}, r"tenants\[0\]: unknown keys \['quota'\]"),
])
def test_a_bad_tenants_file_is_refused_naming_the_entry(data: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse(data, where="tenants.yaml")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_requests_per_second_refuse_past_the_burst_and_say_when_to_retry() -> None:
    clock, tenant = Clock(), Tenant("a", limits=Limits(requests_per_s=2, burst=3))
    admission = Admission([tenant], clock)
    for _ in range(3):
        admission.admit(tenant)
        admission.release(tenant, 0, 5)
    with pytest.raises(Refused) as refused:
        admission.admit(tenant)
    assert refused.value.reason == "rate" and refused.value.retry_after_s == 1.0 and "requests_per_s (2" in refused.value.message
    clock.now += 0.5  # one request's worth at 2/s
    admission.admit(tenant)
    with pytest.raises(Refused):
        admission.admit(tenant)


def test_tokens_per_minute_are_debited_by_real_counts_and_refuse_once_spent() -> None:
    clock, tenant = Clock(), Tenant("a", limits=Limits(tokens_per_min=600))  # 10 tokens a second
    admission = Admission([tenant], clock)
    admission.admit(tenant, tokens=100)
    admission.release(tenant, 100, 900)  # an estimate may fall short: the real count is what is debited
    with pytest.raises(Refused) as refused:
        admission.admit(tenant)
    assert refused.value.reason == "tokens" and refused.value.retry_after_s == 31.0  # 300 owed + 1 needed, at 10/s
    clock.now += 31
    admission.admit(tenant)


def test_a_request_reserves_the_tokens_it_may_use_and_gets_back_what_it_did_not() -> None:
    """The bucket used to admit while above zero and debit only after the answer: one request of 2,048
    long texts took 33 minutes' worth of a 1,000-token tenant, and ten at once overshot ten times."""
    clock, tenant = Clock(), Tenant("a", limits=Limits(tokens_per_min=600))
    admission = Admission([tenant], clock)
    admission.admit(tenant, tokens=500)
    with pytest.raises(Refused, match="100 left, this request may use up to 200") as refused:
        admission.admit(tenant, tokens=200)  # in flight together, they could use 700 of 600
    assert refused.value.reason == "tokens" and refused.value.retry_after_s == 10.0  # 100 more at 10/s
    admission.release(tenant, 500, 120)  # it used 120: 380 come back
    admission.admit(tenant, tokens=200)
    admission.release(tenant, 200, 0)  # failed on the server's side: all of it comes back
    admission.admit(tenant, tokens=480)


def test_a_request_larger_than_the_tokens_per_minute_is_refused_whatever_the_bucket_holds() -> None:
    clock, tenant = Clock(), Tenant("a", limits=Limits(tokens_per_min=600, concurrent_requests=1))
    admission = Admission([tenant], clock)
    with pytest.raises(TooLarge, match=r"at least 601 tokens, more than the tokens_per_min of tenant 'a' \(600\)"):
        admission.admit(tenant, tokens=2000, least_tokens=601)
    assert admission.admit(tenant, tokens=600, least_tokens=600) == 600  # the refusal took nothing


def test_a_request_that_may_use_more_than_the_minute_but_surely_not_reserves_the_whole_bucket() -> None:
    """Bytes overstate a text's tokens ~3x: a batch that fits by its words is served, not refused by its
    bytes; it waits for a full bucket, and what it used over the bucket is owed."""
    clock, tenant = Clock(), Tenant("a", limits=Limits(tokens_per_min=600))  # 10 tokens a second
    admission = Admission([tenant], clock)
    assert admission.admit(tenant, tokens=1800, least_tokens=300) == 600
    with pytest.raises(Refused, match="0 left, this request may use up to 10"):
        admission.admit(tenant, tokens=10, least_tokens=5)  # the whole bucket is held until it settles
    admission.release(tenant, 600, 450)  # it used 450: 150 come back
    admission.admit(tenant, tokens=150)
    admission.release(tenant, 150, 150)
    clock.now += 60  # full again
    reserved = admission.admit(tenant, tokens=1800, least_tokens=300)
    admission.release(tenant, reserved, 700)  # 100 over the bucket: owed, refilled at 10/s
    with pytest.raises(Refused) as refused:
        admission.admit(tenant, tokens=1)
    assert refused.value.retry_after_s == 11.0  # 100 owed + 1 needed, at 10/s


def test_concurrency_counts_requests_in_flight_and_a_refusal_takes_nothing() -> None:
    clock = Clock()
    a, b = Tenant("a", limits=Limits(concurrent_requests=2, requests_per_s=100, burst=3)), Tenant("b")
    admission = Admission([a, b], clock)
    admission.admit(a)
    admission.admit(a)
    for _ in range(5):
        with pytest.raises(Refused, match="2 requests in flight") as refused:
            admission.admit(a)
        assert refused.value.reason == "concurrency"
    for _ in range(50):  # another tenant is not affected; no limits, no refusals
        admission.admit(b)
    admission.release(a, 0, 0)
    admission.admit(a)  # the refusals above did not spend the burst of 3
