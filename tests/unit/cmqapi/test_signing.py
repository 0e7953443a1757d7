"""CA1: CMQ's signature, known answers, and the Timestamp / Nonce checks.

The first answer is the worked example of CMQ's public "Signature method" page; the others
were computed by hand from the documented algorithm (``printf '%s' "$text" | openssl dgst
-sha1 -hmac KEY -binary | base64``), not by the code under test.
"""

from __future__ import annotations

import pytest

from gateway.cmqapi.errors import AUTH, CmqApiError
from gateway.cmqapi.signing import NonceCache, check_timestamp, signature, string_to_sign, verify_signature

DOC_PARAMS = {"Action": "DescribeInstances", "Nonce": "11886", "Region": "gz",
              "SecretId": "AKIDz8krbsJ5yKBZQpn74WFkmLPx3gnPhESA", "Timestamp": "1465185768",
              "instanceIds.0": "ins-09dx96dg", "limit": "20", "offset": "0"}
DOC_KEY = "Gu5t9xGARNpq86cd98joQYCN3Cozk1qA"
DOC_TEXT = ("GETcvm.api.qcloud.com/v2/index.php?Action=DescribeInstances&Nonce=11886&Region=gz"
            "&SecretId=AKIDz8krbsJ5yKBZQpn74WFkmLPx3gnPhESA&Timestamp=1465185768&instanceIds.0=ins-09dx96dg"
            "&limit=20&offset=0")


def test_CA1_documented_example_string_and_signature() -> None:
    """CA1: the worked example of CMQ's signature page, byte for byte."""
    assert string_to_sign("get", "cvm.api.qcloud.com", "/v2/index.php", DOC_PARAMS) == DOC_TEXT
    assert signature(DOC_KEY, DOC_TEXT) == "NSI3UqqD99b/UJb4tbG/xZpRW64="


def test_CA1_known_answers_sha1_and_sha256() -> None:
    """CA1: HmacSHA1 and HmacSHA256 over a CMQ request (hand-computed answers)."""
    params = {"Action": "SendMessage", "Nonce": "2889712707386595659", "RequestClient": "SDK_Python_1.3",
              "SecretId": "AKIDtest", "SignatureMethod": "HmacSHA1", "Timestamp": "1534154812",
              "delaySeconds": "0", "msgBody": "msg", "queueName": "test1"}
    text = string_to_sign("POST", "cmq-queue-gz.api.tencentyun.com", "/v2/index.php", params)
    assert text == ("POSTcmq-queue-gz.api.tencentyun.com/v2/index.php?Action=SendMessage&Nonce=2889712707386595659"
                    "&RequestClient=SDK_Python_1.3&SecretId=AKIDtest&SignatureMethod=HmacSHA1"
                    "&Timestamp=1534154812&delaySeconds=0&msgBody=msg&queueName=test1")
    assert signature("pPgfLipfEXZ7VcRzhAMIyPaU7UbQyFFx", text, "HmacSHA1") == "ysgIJEYXSdZt8DGOgn5TLhudCGA="
    assert signature("pPgfLipfEXZ7VcRzhAMIyPaU7UbQyFFx", text, "HmacSHA256") == \
        "e665JYsyGGdDoyaLQL5C3ygHBo4/xKtb3zcHfUapMY8="


def test_CA1_underscore_names_raw_values_and_post_at_values() -> None:
    """CA1: ``_`` in a name is signed as ``.``; values are signed raw (not URL-encoded); in
    a POST a value starting with ``@`` is left out, as the SDKs do; Signature never signs."""
    params = {"msgBody_1": "a b&c=d", "Action": "X", "file": "@/tmp/x", "Signature": "zzz"}
    assert string_to_sign("POST", "h", "/v2/index.php", params) == "POSTh/v2/index.php?Action=X&msgBody.1=a b&c=d"
    assert string_to_sign("GET", "h", "/v2/index.php", params) == \
        "GETh/v2/index.php?Action=X&file=@/tmp/x&msgBody.1=a b&c=d"


def test_CA1_verify_accepts_host_with_or_without_port() -> None:
    params = {"Action": "ListQueue", "Nonce": "1", "SecretId": "AKID", "Timestamp": "1"}
    for host in ("127.0.0.1:15680", "127.0.0.1"):
        signed = {**params, "Signature": signature("k", string_to_sign("POST", host, "/v2/index.php", params))}
        assert verify_signature("k", "POST", ["127.0.0.1:15680", "127.0.0.1"], "/v2/index.php", signed)
    bad = {**params, "Signature": signature("other", string_to_sign("POST", "127.0.0.1", "/v2/index.php", params))}
    assert not verify_signature("k", "POST", ["127.0.0.1"], "/v2/index.php", bad)


def test_CA1_timestamp_window() -> None:
    check_timestamp("1000", 1000 + 300)
    check_timestamp("1300", 1000)
    with pytest.raises(CmqApiError) as e:
        check_timestamp("1000", 1000 + 301)
    assert e.value.code == AUTH
    with pytest.raises(CmqApiError) as e:
        check_timestamp("soon", 1000)
    assert e.value.code == 4000


def test_CA1_replayed_nonce_refused_per_secret_id() -> None:
    cache = NonceCache(window=300)
    cache.use("AKID1", "42", 1000)
    cache.use("AKID2", "42", 1000)  # another key may use the same number
    with pytest.raises(CmqApiError) as e:
        cache.use("AKID1", "42", 1100)
    assert e.value.code == AUTH and "Nonce" in e.value.message
    cache.use("AKID1", "43", 2000)  # far later: the old entries are gone
    assert len(cache) == 1
