"""The OpenAPI document of a served pipeline, generated from its input columns and their kinds, and the
output columns it answers with."""
from __future__ import annotations

from typing import Any

__all__ = ["openapi_document"]

_KIND_SCHEMAS: dict[str, dict[str, Any]] = {
    "number": {"type": "number"},
    "vector": {"type": "array", "items": {"type": "number"}, "minItems": 1},
    "string": {"type": "string"},
    "image": {"type": "string", "format": "byte", "description": "an encoded image file, base64"},
}


def _column_schema(kinds: set[str], nullable: bool) -> dict[str, Any]:
    options = [_KIND_SCHEMAS[k] for k in sorted(kinds)]
    schema = options[0] if len(options) == 1 else {"oneOf": options}
    return {"anyOf": [schema, {"type": "null"}]} if nullable else schema


def openapi_document(predictor: Any) -> dict[str, Any]:
    """OpenAPI 3.1 for ``POST /predict``: a row object or an array of rows, and the responses (an answer
    names the predictor's output columns)."""
    row = {"type": "object", "additionalProperties": False, "required": list(predictor.inputs),
           "properties": {c: _column_schema(k, predictor.nullable[c]) for c, k in predictor.inputs.items()}}
    content: dict[str, Any] = {"application/json": {"schema": {"oneOf": [
        row, {"type": "array", "items": row, "minItems": 1}]}}}
    if len(predictor.inputs) == 1 and "image" in next(iter(predictor.inputs.values())):
        column = next(iter(predictor.inputs))
        content["image/*"] = {"schema": {"type": "string", "format": "binary"}}
        content["multipart/form-data"] = {"schema": {"type": "object", "properties": {
            column: {"type": "string", "format": "binary"}}}}
    error = {"content": {"application/json": {"schema": {
        "type": "object", "properties": {"error": {"type": "string"}}}}}}
    answer = {"type": "object", "required": list(predictor.outputs),
              "properties": {c: {} for c in predictor.outputs}}
    responses = {"200": {"description": "the output columns, in the request's shape (an object for an object, "
                                        "an array for an array): " + ", ".join(predictor.outputs),
                         "content": {"application/json": {"schema": {"oneOf": [
                             answer, {"type": "array", "items": answer}]}}}}}
    for status, text in (("400", "malformed body"), ("401", "missing or wrong bearer token"),
                         ("413", "body over the limit (the answer closes the connection)"),
                         ("415", "content type not accepted"),
                         ("422", "a value the pipeline cannot take"), ("503", "queue full; retry"),
                         ("504", "the pipeline did not answer in time")):
        responses[status] = {"description": text, **error}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Irbis pipeline", "version": "1"},
        "paths": {
            "/predict": {"post": {"requestBody": {"required": True, "content": content},
                                  "responses": responses}},
            "/health": {"get": {"responses": {"200": {"description": "the process is up"}}}},
            "/ready": {"get": {"responses": {"200": {"description": "ready to serve"},
                                             "503": {"description": "stopping"}}}},
        },
    }
