"""What a server's /models answer gives: names only from an OpenAI model list, nothing from anything
else."""

from __future__ import annotations

from kevload.wire.models import model_names, refusal_message


def test_model_names_come_only_from_a_200_with_a_model_list():
    assert model_names(200, b'{"object":"list","data":[{"id":"a"},{"id":"b","x":1}]}') == ("a", "b")
    assert model_names(404, b'{"data":[{"id":"a"}]}') is None
    assert model_names(200, None) is None  # over the size limit
    assert model_names(200, b'{"data":[{"id":7}]}') is None  # an id that is no name
    assert model_names(200, b'{"data":"a"}') is None
    assert model_names(200, b"<html>") is None


def test_the_refusal_names_the_model_what_the_server_said_and_what_it_serves():
    assert refusal_message("x", "http_400", " no such model ", ("a", "b")) == (
        "the server does not serve model 'x' (http_400: no such model); it serves 'a', 'b'"
    )
    assert refusal_message("x", "http_404", None, ("a",)) == (
        "the server does not serve model 'x' (http_404); it serves 'a'; send that name "
        "(--model 'a', or target.model)"
    )
