"""Reasoner: one registered function, with the JSON binding of its inputs and output.

The body is validated once against a pydantic model built from the signature, so a bad
request is a 422 before any task exists, and the result is serialised by its annotation.
"""

from __future__ import annotations

import collections.abc
import hashlib
import inspect
import json
import typing
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from pydantic import (
    AliasChoices,
    AliasPath,
    BaseModel,
    ConfigDict,
    PydanticUserError,
    TypeAdapter,
    ValidationError,
    create_model,
)

from agent_server.model import jsoncodec
from agent_server.model.context import ExecutionContext

# Defined beside the options it mostly refuses; still imported from here as well.
from agent_server.model.reasoner_options import ReasonerDefinitionError as ReasonerDefinitionError
from agent_server.model.reasoner_options import ReasonerOptions

ReasonerFunc = Callable[..., Any]


class Reasoner:
    """A function plus how to turn a JSON body into its arguments and its result into JSON."""

    def __init__(self, func: ReasonerFunc, options: ReasonerOptions) -> None:
        name = options.name
        self.func, self.options, self.name = func, options, name
        #: A resumable reasoner's executions are handed off at shutdown (with a shared
        #: store) and retried after their owner's death, up to `max_attempts` attempts.
        self.resumable, self.max_attempts = options.resumable, options.attempts
        #: Seconds an attempt may run (time waiting for input not counted), or None.
        self.timeout = options.timeout
        #: How a failed attempt runs again (queued with its due time), or None.
        self.retry = options.retry
        #: At most this many attempts run at once per value of `concurrency_key` ("header:
        #: NAME", "session", or None: the whole reasoner), across replicas; None: no limit.
        self.max_concurrency = options.max_concurrency
        self.concurrency_key = options.concurrency_key
        #: What a start in a session does beside the session's other work, by default.
        self.session_policy = options.policy
        #: Its version on this replica (its own `version=`, else its agent's) and what it
        #: resumes besides (model/versions.py).
        self.versions = options.versions
        self.description = (
            options.description if options.description is not None else _first_line(func)
        )
        #: An `async def` generator: each `yield` is an `output` event, the result the list.
        self.is_generator = inspect.isasyncgenfunction(func)
        if inspect.isgeneratorfunction(func):
            raise ReasonerDefinitionError(
                f"reasoner {name!r}: a def generator would run in a thread, which cannot be "
                "cancelled or closed: stream with an async def generator"
            )
        self.is_async = inspect.iscoroutinefunction(func) or self.is_generator
        if self.timeout is not None and not self.is_async:
            raise ReasonerDefinitionError(
                f"reasoner {name!r}: a def reasoner runs in a thread, which cannot be "
                "cancelled: timeout= needs an async def"
            )
        try:
            hints = typing.get_type_hints(func, include_extras=True)  # keep Annotated[..., Field]
        except Exception as exc:
            raise ReasonerDefinitionError(
                f"reasoner {name!r}: cannot resolve hints: {exc}"
            ) from exc
        self._build_input_model(hints)
        return_annotation = hints.get("return", Any)
        if self.is_generator:
            item = _yield_type(return_annotation)
            #: A generator's yielded values, one at a time (each an `output` event).
            self.item_adapter: TypeAdapter[Any] | None = _output_adapter(item)
            return_annotation = list[item]  # type: ignore[valid-type]
        else:
            self.item_adapter = None
        self.output_adapter: TypeAdapter[Any] = _output_adapter(return_annotation)
        #: Its declared schedules (docs/schedules.md), each input bound once here.
        self.schedules = tuple(options.schedules)
        for schedule in self.schedules:
            try:
                self.bind(dict(schedule.input))
            except ValidationError as exc:
                raise ReasonerDefinitionError(
                    f"reasoner {name!r}: a schedule's input does not bind: {exc}"
                ) from None

    def _build_input_model(self, hints: dict[str, Any]) -> None:
        """The input model from the signature: its one model parameter's, else one made of
        its parameters (an `ExecutionContext` parameter is handed the context instead)."""
        name = self.name
        self._context_params: list[str] = []
        fields: dict[str, Any] = {}
        for param in inspect.signature(self.func).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
                raise ReasonerDefinitionError(
                    f"reasoner {name!r}: parameter {param.name!r} must be a plain keyword parameter"
                )
            annotation = hints.get(param.name, Any)
            if annotation is ExecutionContext:
                self._context_params.append(param.name)
                continue
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (annotation, default)
        self._model_param: str | None = None
        single = next(iter(fields.values()), None) if len(fields) == 1 else None
        if single is not None and _is_model(single[0]):
            self._model_param = next(iter(fields))
            self.input_model: type[BaseModel] = single[0]
        else:
            self.input_model = create_model(
                f"{_camel(name)}Input", __config__=ConfigDict(extra="forbid"), **fields
            )
        self._field_names = tuple(self.input_model.model_fields)
        #: For a model input without its own rule for extra keys: the keys it declares.
        self._declared = None if self._model_param is None else _declared_keys(self.input_model)

    def canonical(self, body: Any) -> Any:
        """The body as the reasoner reads it, as JSON data: what makes two requests the same
        for an Idempotency-Key (`5` and `5.0` for a float field, a default left out or sent,
        are one request). Raises pydantic's error as `bind` does."""
        model = self._validated(body)
        return self.input_model.__pydantic_serializer__.to_python(model, mode="json")

    def fingerprint(self, session_id: str | None, body: Any) -> str:
        """What makes two requests the same for an Idempotency-Key: this reasoner, the
        session and the body as it reads it (`canonical`), as JSON with keys sorted."""
        text = json.dumps(
            [self.name, session_id, self.canonical(body)], sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def _validated(self, body: Any) -> Any:
        if self._declared is not None and isinstance(body, dict):
            _refuse_unknown(self.input_model, body, self._declared)
        return self.input_model.__pydantic_validator__.validate_python({} if body is None else body)

    def bind(self, body: Any) -> dict[str, Any]:
        """Validate a decoded JSON body into keyword arguments; raises pydantic's error."""
        # pydantic-core's validator and serializers are called directly: the Python wrappers
        # around them cost much for a small body or result (bench/RESULTS.md).
        model = self._validated(body)
        if self._model_param is not None:
            return {self._model_param: model}
        return {name: getattr(model, name) for name in self._field_names}

    @property
    def concurrency_header(self) -> str | None:
        """The request header `concurrency_key="header:NAME"` names, else None."""
        key = self.concurrency_key
        return key[len("header:") :] if key is not None and key.startswith("header:") else None

    @property
    def emits(self) -> bool:
        """Whether its runs may emit events: it takes a context, or it is a generator."""
        return self.is_generator or bool(self._context_params)

    def call(self, arguments: dict[str, Any], context: ExecutionContext | None) -> Any:
        """Call the function; a coroutine for `async def`, the plain result otherwise."""
        for param in self._context_params:
            arguments[param] = context
        return self.func(**arguments)

    def generator(
        self, arguments: dict[str, Any], context: ExecutionContext | None
    ) -> AsyncGenerator[Any, Any]:
        """The async generator a generator reasoner's call makes."""
        result = self.call(arguments, context)
        if not inspect.isasyncgen(result):
            raise ReasonerDefinitionError(f"reasoner {self.name!r} did not return a generator")
        return result

    def serialize_item(self, value: Any) -> Any:
        """A yielded value as JSON-ready data (an `output` event's), validated by the yield
        type as a result is by its annotation; raises when it cannot be represented."""
        adapter = self.item_adapter
        if adapter is None:
            raise ReasonerDefinitionError(f"reasoner {self.name!r} is not a generator")
        data = adapter.serializer.to_python(adapter.validator.validate_python(value), mode="json")
        jsoncodec.check(data, "a yielded value")
        return data

    def coroutine(
        self, arguments: dict[str, Any], context: ExecutionContext | None
    ) -> Awaitable[Any]:
        result = self.call(arguments, context)
        if not inspect.isawaitable(result):
            raise ReasonerDefinitionError(f"reasoner {self.name!r} did not return an awaitable")
        return result

    def serialize(self, value: Any) -> Any:
        """JSON-ready data for the result; raises when the value cannot be represented."""
        # Validated first: a value that contradicts the annotation (and so the published
        # output schema) fails the execution instead of passing with a serializer warning.
        adapter = self.output_adapter
        data = adapter.serializer.to_python(adapter.validator.validate_python(value), mode="json")
        # What cannot be written and read back the same (NaN, an infinity, an integer past
        # the parser's digit limit, nesting too deep) fails the execution here, rather than
        # every later read of it with a 500.
        jsoncodec.check(data, "the result")
        return data

    def input_schema(self, ref_template: str = "#/$defs/{model}") -> dict[str, Any]:
        schema = self.input_model.model_json_schema(ref_template=ref_template)
        if self._declared is not None:  # the one rule for unknown keys, published
            schema["additionalProperties"] = False
        return schema

    def output_schema(self, ref_template: str = "#/$defs/{model}") -> dict[str, Any]:
        try:
            return self.output_adapter.json_schema(ref_template=ref_template)
        except Exception:  # a type pydantic cannot describe still serves; its schema is open
            return {}

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema(),
            "output_schema": self.output_schema(),
        }


#: What an `async def` generator may be annotated to return: its yield type is the first
#: argument.
_GENERATOR_ORIGINS = (
    collections.abc.AsyncGenerator,
    collections.abc.AsyncIterator,
    collections.abc.AsyncIterable,
)


def _yield_type(annotation: Any) -> Any:
    """The type a generator yields, from its return annotation (`AsyncIterator[T]`,
    `AsyncGenerator[T, None]`, `AsyncIterable[T]`); Any when unannotated or bare."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in _GENERATOR_ORIGINS:
        args = typing.get_args(annotation)
        return args[0] if args else Any
    return Any


def _is_model(annotation: Any) -> bool:
    return inspect.isclass(annotation) and issubclass(annotation, BaseModel)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.replace("-", "_").split("_")) or "Reasoner"


def _first_line(func: ReasonerFunc) -> str | None:
    doc = inspect.getdoc(func)
    return doc.splitlines()[0] if doc else None


def _output_adapter(annotation: Any) -> TypeAdapter[Any]:
    """The result's adapter. NaN and infinities stay floats in the JSON-ready data (by
    default pydantic turns them into null in untyped data), so `jsoncodec.check` refuses
    them instead of recording a null the reasoner never returned. A model brings its own
    configuration (pydantic refuses another for it)."""
    try:
        return TypeAdapter(annotation, config=ConfigDict(ser_json_inf_nan="constants"))
    except PydanticUserError:
        return TypeAdapter(annotation)


def _declared_keys(model: type[BaseModel]) -> frozenset[str] | None:
    """One rule for every reasoner: a top-level key the input does not declare is a 422, as
    for a reasoner of plain parameters (pydantic's default for a model is to drop it). The
    keys a model declares (names and aliases), or None when the model says itself what to
    do with extra keys (`model_config = ConfigDict(extra=...)`): its rule holds."""
    if model.model_config.get("extra") is not None:
        return None
    keys: set[str] = set()
    for name, info in model.model_fields.items():
        keys.add(name)
        for alias in (info.alias, info.validation_alias):
            if isinstance(alias, str):
                keys.add(alias)
            elif isinstance(alias, AliasChoices):
                keys.update(c for c in alias.choices if isinstance(c, str))
            elif isinstance(alias, AliasPath) and alias.path and isinstance(alias.path[0], str):
                keys.add(alias.path[0])
    return frozenset(keys)


def _refuse_unknown(model: type[BaseModel], body: dict[str, Any], declared: frozenset[str]) -> None:
    unknown = [key for key in body if key not in declared]
    if unknown:
        raise ValidationError.from_exception_data(
            model.__name__,
            [{"type": "extra_forbidden", "loc": (key,), "input": body[key]} for key in unknown],
        )
