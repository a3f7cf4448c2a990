"""Host memory registered with the GPU driver: page-locked and mapped for DMA, by ctypes on
the driver's own library, with no compiler and no torch.

A GPU copies from host memory at full speed only when the range is registered; engines do
it by hand today, each with its own bugs (the runtime API's sticky errors, registration
faulting missing pages on the wrong thread, fork copying pinned pages into every
DataLoader worker).  Here, per vendor (:data:`numabind._model.VENDORS`'
``host_register`` rows):

* **CUDA, through the driver API** (``libcuda.so.1``): ``cuInit``, the device's primary
  context retained and *pushed* current around each call and popped after (the caller's
  current context is untouched), ``cuMemHostRegister_v2`` with
  ``CU_MEMHOSTREGISTER_PORTABLE`` (every context sees the registration) in chunks of
  :data:`CHUNK` (one huge registration fails or stalls on some drivers), and on
  :meth:`Registration.unregister` ``cuMemHostUnregister`` per chunk, then the context
  released.  Errors are named with ``cuGetErrorName``.  The driver API has no sticky
  error state: a failed call does not poison the process's CUDA runtime.
* **HIP** (``libamdhip64.so``): ``hipHostRegister`` with ``hipHostRegisterPortable``
  around ``hipSetDevice``, the caller's device set back after; ``hipGetErrorName``.
* **Where only the CUDA runtime is loaded** (no ``libcuda.so.1`` this process can open,
  but torch's CUDA is initialised): ``torch.cuda.cudart().cudaHostRegister``.

:class:`DeviceCopies` times copies between a registered range and device memory with the
same library's calls (``numabind bench``: a host buffer on the GPU's node against one on a
remote node).

A registration that fails half-way unregisters the chunks it made.  The caller populates
the range first (registration faults missing pages in on the registering thread, that is
wherever that thread runs) and marks it ``MADV_DONTFORK`` (:mod:`numabind.memory._memory`).
"""

from __future__ import annotations

import ctypes
import time

from .._errors import DriverError, RegistrationError
from .._model import VENDORS, HostRegisterApi

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .._model import Accelerator

CHUNK = 1 << 30  # bytes per registration call
_loaded: dict[str, Any] = {}  # API name -> its library (or the reason it did not load)


class Registration:
    """One range registered with one driver, chunk by chunk; :meth:`unregister` undoes it
    (idempotent) and returns the errors it met, if any."""

    def __init__(
        self, driver: Driver, address: int, nbytes: int, device: int, token: Any, chunks: list[int]
    ) -> None:
        self.driver = driver
        self.address = address
        self.nbytes = nbytes
        self.device = device
        self.token = token  # the CUDA primary context kept retained while registered
        self.chunks = chunks

    def unregister(self) -> list[str]:
        if not self.chunks:
            return []
        chunks, self.chunks = self.chunks, []
        return self.driver.unregister_chunks(chunks, self.device, self.token)


class Driver:
    """A vendor driver's registration calls on one loaded library."""

    def __init__(self, api: HostRegisterApi, lib: Any) -> None:
        self.api = api
        self.lib = lib
        self.name = api.name
        self._fn: dict[str, Any] = {}

    def fn(self, name: str) -> Any:
        found = self._fn.get(name)
        if found is None:
            found = getattr(self.lib, name)  # AttributeError: this library lacks it
            found.restype = ctypes.c_int
            self._fn[name] = found
        return found

    def error(self, code: int) -> str:
        """``CUDA_ERROR_OUT_OF_MEMORY (2)``: the driver's name for a status code."""
        name: str | None = None
        try:
            if self.api.context == "primary-context":
                out = ctypes.c_char_p()
                if self.fn(self.api.error_name)(code, ctypes.byref(out)) == 0 and out.value:
                    name = out.value.decode("ascii", "replace")
            else:
                get = getattr(self.lib, self.api.error_name)
                get.restype = ctypes.c_char_p
                value = get(code)
                name = value.decode("ascii", "replace") if value else None
        except (AttributeError, OSError):
            name = None
        return f"{name or 'error'} ({code})"

    def call(self, name: str, *args: Any) -> None:
        code = self.fn(name)(*args)
        if code != 0:
            raise DriverError(f"{self.name}: {name} failed: {self.error(code)}")

    # --- device and context
    def device(self, acc: Accelerator | None, index: int | None) -> int:
        """The driver's handle for the device: by PCI address when known, else by index
        among the visible devices (0 when neither: a portable registration is seen by
        every device's context)."""
        out = ctypes.c_int()
        if acc is not None and acc.pci:
            self.call(self.api.device_by_pci, ctypes.byref(out), acc.pci.encode())
            return out.value
        ordinal = index or 0
        if not self.api.device_by_index:
            return ordinal
        self.call(self.api.device_by_index, ctypes.byref(out), ordinal)
        return out.value

    def retain(self, device: int) -> Any:
        """What keeps the device usable while numabind holds something on it: the CUDA
        primary context, retained (:meth:`release` gives it back); HIP needs nothing."""
        if self.api.context != "primary-context":
            return None
        ctx = ctypes.c_void_p()
        self.call(dict(self.api.functions)["retain"], ctypes.byref(ctx), device)
        return ctx

    def release(self, device: int) -> None:
        if self.api.context == "primary-context":
            self.fn(dict(self.api.functions)["release"])(device)

    def push(self, device: int, token: Any) -> Any:
        """Make the device current on the calling thread (the retained context pushed, or
        HIP's current device set); returns what :meth:`pop` restores.  The caller's own
        current context or device is what it was once popped."""
        roles = dict(self.api.functions)
        if self.api.context == "primary-context":
            self.call(roles["push"], token)
            return None
        old = ctypes.c_int()
        self.call(roles["get"], ctypes.byref(old))
        self.call(roles["set"], device)
        return old.value

    def pop(self, restore: Any) -> None:
        roles = dict(self.api.functions)
        if self.api.context == "primary-context":
            self.fn(roles["pop"])(ctypes.byref(ctypes.c_void_p()))
        else:
            self.fn(roles["set"])(restore)

    # --- registration
    def register(self, address: int, nbytes: int, device: int) -> Registration:
        """Register ``[address, address + nbytes)`` in chunks; on a failure, unregister
        what was registered and raise :class:`RegistrationError` naming the driver's
        error.  The primary context stays retained while the range is registered."""
        try:
            token = self.retain(device)
        except DriverError as err:
            raise RegistrationError(str(err)) from None
        try:
            restore = self.push(device, token)
        except DriverError as err:
            self.release(device)
            raise RegistrationError(str(err)) from None
        chunks: list[int] = []
        failed: DriverError | None = None
        try:
            start, end = address, address + nbytes
            while start < end:
                size = min(CHUNK, end - start)
                try:
                    self.call(
                        self.api.register, ctypes.c_void_p(start), ctypes.c_size_t(size),
                        self.api.portable,
                    )  # fmt: skip
                except DriverError as err:
                    failed = err
                    break
                chunks.append(start)
                start += size
            if failed is not None:
                for chunk in chunks:
                    self.fn(self.api.unregister)(ctypes.c_void_p(chunk))
        finally:
            self.pop(restore)
            if failed is not None:
                self.release(device)
        if failed is not None:
            done = f"{len(chunks)} of {-(-nbytes // CHUNK)} chunks had registered"
            raise RegistrationError(f"{failed} ({done}, and were unregistered)")
        return Registration(self, address, nbytes, device, token, chunks)

    def unregister_chunks(self, chunks: list[int], device: int, token: Any) -> list[str]:
        """Unregister the chunks with the same device current as when they were made; for
        the CUDA driver API, the context register() kept retained is pushed, then released."""
        errors: list[str] = []
        pushed = True
        try:
            restore = self.push(device, token)
        except DriverError as err:
            errors.append(str(err))
            pushed, restore = False, None
        for chunk in chunks:
            code = self.fn(self.api.unregister)(ctypes.c_void_p(chunk))
            if code != 0:
                errors.append(f"{self.name}: {self.api.unregister} failed: {self.error(code)}")
        if pushed:
            self.pop(restore)
        self.release(device)  # the retain register() kept
        return errors

    @property
    def can_copy(self) -> bool:
        """Whether numabind knows this driver's copy calls (:class:`DeviceCopies`)."""
        return bool(self.api.copies)


class DeviceCopies:
    """``nbytes`` of device memory and a stream on one device, to time copies between it
    and registered host memory (``numabind bench``).  By the driver's own calls, so the
    bench needs no torch and times exactly one asynchronous copy and one stream wait.  Any
    thread may call :meth:`copy`: the device is made current around each call, as for
    registration, and the calling thread's own current context is left as it was."""

    def __init__(self, driver: Driver, device: int, nbytes: int) -> None:
        self.driver = driver
        self.device = device
        self.nbytes = nbytes
        self.roles = dict(driver.api.copies)
        if not self.roles:
            raise DriverError(f"{driver.name}: numabind knows no copy calls for it")
        self.token = driver.retain(device)
        self.dptr = ctypes.c_uint64()
        self.stream = ctypes.c_void_p()
        try:
            restore = driver.push(device, self.token)
        except DriverError:
            driver.release(device)
            raise
        try:
            driver.call(self.roles["alloc"], ctypes.byref(self.dptr), ctypes.c_size_t(nbytes))
            try:
                driver.call(self.roles["stream"], ctypes.byref(self.stream), ctypes.c_uint(1))
            except DriverError:
                driver.fn(self.roles["free"])(self.dptr)
                raise
        except DriverError:
            driver.pop(restore)
            driver.release(device)
            raise
        driver.pop(restore)
        self.open = True

    def copy(self, kind: str, host: int, nbytes: int) -> float:
        """Copy ``nbytes`` (at most the device buffer) host->device (``h2d``) or
        device->host (``d2h``) and wait for it; the seconds from the copy's start to the
        end of the wait."""
        if not self.open:
            raise DriverError(f"{self.driver.name}: the device buffer is freed")
        n = ctypes.c_size_t(min(nbytes, self.nbytes))
        host_ptr = ctypes.c_void_p(host)
        args = (self.dptr, host_ptr) if kind == "h2d" else (host_ptr, self.dptr)
        copy, sync = self.driver.fn(self.roles[kind]), self.driver.fn(self.roles["sync"])
        elapsed = 0.0
        restore = self.driver.push(self.device, self.token)
        try:
            t0 = time.perf_counter()
            code = copy(*args, n, self.stream)
            if code == 0:
                code = sync(self.stream)
                elapsed = time.perf_counter() - t0
        finally:
            self.driver.pop(restore)
        if code != 0:
            raise DriverError(f"{self.driver.name}: {kind} copy failed: {self.driver.error(code)}")
        return elapsed

    def close(self) -> None:
        """Destroy the stream, free the device memory, release the device (idempotent)."""
        if not self.open:
            return
        self.open = False
        try:
            restore = self.driver.push(self.device, self.token)
        except DriverError:
            self.driver.release(self.device)
            return
        self.driver.fn(self.roles["stream_destroy"])(self.stream)
        self.driver.fn(self.roles["free"])(self.dptr)
        self.driver.pop(restore)
        self.driver.release(self.device)


def _load(api: HostRegisterApi) -> Driver | str:
    """The driver's library, initialised once per process; or why it is not there."""
    cached = _loaded.get(api.name)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    result: Driver | str
    lib = None
    for soname in api.sonames:
        try:
            lib = ctypes.CDLL(soname)
            break
        except OSError:
            continue
    if lib is None:
        names = api.sonames
        which = (
            f"{names[0]} does not load" if len(names) == 1 else f"none of {', '.join(names)} loads"
        )
        result = f"no {api.name} ({which})"
    else:
        driver = Driver(api, lib)
        try:
            code = driver.fn(api.init)(0)
        except AttributeError:
            result = f"{api.sonames[0]} has no {api.init}: not a {api.name} library"
        else:
            result = driver if code == 0 else f"{api.name}: {api.init} failed: {driver.error(code)}"
    _loaded[api.name] = result
    return result


class TorchRuntime(Driver):
    """The CUDA runtime through torch, where ``libcuda.so.1`` does not load but torch's CUDA
    is initialised: ``cudaHostRegister`` on the runtime's current device (chunked too)."""

    def __init__(self, cudart: Any) -> None:
        self.cudart = cudart
        self.name = "CUDA runtime (torch)"

    can_copy = False  # bench times the driver's own calls only

    def device(self, acc: Accelerator | None, index: int | None) -> int:
        return 0

    def register(self, address: int, nbytes: int, device: int) -> Registration:
        chunks: list[int] = []
        start, end = address, address + nbytes
        while start < end:
            size = min(CHUNK, end - start)
            code = int(self.cudart.cudaHostRegister(start, size, 1))  # cudaHostRegisterPortable
            if code != 0:
                for chunk in chunks:
                    self.cudart.cudaHostUnregister(chunk)
                raise RegistrationError(f"{self.name}: cudaHostRegister failed: error {code}")
            chunks.append(start)
            start += size
        return Registration(self, address, nbytes, device, None, chunks)

    def unregister_chunks(self, chunks: list[int], device: int, token: Any) -> list[str]:
        out = []
        for chunk in chunks:
            code = int(self.cudart.cudaHostUnregister(chunk))
            if code != 0:
                out.append(f"{self.name}: cudaHostUnregister failed: error {code}")
        return out


def _torch_runtime() -> TorchRuntime | None:
    import sys

    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_available() or not cuda.is_initialized():
            return None
        return TorchRuntime(cuda.cudart())
    except Exception:
        return None


def driver_for(acc: Accelerator | None) -> tuple[Driver | None, str]:
    """The driver that registers host memory for ``acc`` (its vendor's; with no device, the
    first vendor whose driver loads), else None and why none did."""
    apis = [v.host_register for v in VENDORS if v.host_register is not None]
    if acc is not None:
        own = next((v.host_register for v in VENDORS if v.key == acc.vendor), None)
        if own is None:
            return None, f"numabind registers no host memory for {acc.vendor} devices"
        apis = [own]
    reasons = []
    for api in apis:
        found = _load(api)
        if isinstance(found, Driver):
            return found, ""
        reasons.append(found)
    if acc is None or acc.vendor == "nvidia":
        runtime = _torch_runtime()
        if runtime is not None:
            return runtime, ""
    return None, "; ".join(reasons)
