#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The C variants: Benchmarks/c/bench_c.c, built by `make bench` into a
/// shared library and loaded here with dlopen. Its functions are found by
/// name with dlsym.
final class CLibrary {
  /// `double bench_c_<name>(int64_t n, double *extra)`.
  typealias Timed = @convention(c) (Int64, UnsafeMutablePointer<Double>?) -> Double
  /// `void *bench_c_make(int64_t kind, int64_t handle, void *queue)`.
  typealias Make = @convention(c) (Int64, Int64, UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer?
  /// `void bench_c_free(int64_t kind, void *object)`.
  typealias Free = @convention(c) (Int64, UnsafeMutableRawPointer?) -> Void

  /// What the C column says when the library is missing.
  static let missing = "not built (run make bench)"

  /// The default path, relative to the package folder (where `make bench` runs).
  static let defaultPath = ".build/bench/libbench_c.so"

  let path: String
  private let handle: UnsafeMutableRawPointer

  /// Loads the library at `path`; nil (with a note on standard error) when
  /// it is not there or does not load.
  init?(path: String) {
    guard access(path, R_OK) == 0 else { return nil }
    guard let handle = dlopen(path, RTLD_NOW | RTLD_LOCAL) else {
      note("GCDBenchmarks: cannot load \(path): \(String(cString: dlerror()))")
      return nil
    }
    self.path = path
    self.handle = handle
  }

  func symbol<T>(_ name: String, as type: T.Type) -> T? {
    guard let address = dlsym(handle, name) else { return nil }
    return unsafeBitCast(address, to: type)
  }

  func timed(_ name: String) -> Timed? { symbol("bench_c_" + name, as: Timed.self) }

  /// A runner for `bench_c_<name>`: its result is the sample's value and
  /// `extra[i]` becomes the extra named `extraKeys[i]`. `input` fills
  /// `extra` before the call.
  func runner(_ name: String, extraKeys: [String] = [], input: [Double] = []) -> Runner {
    guard let function = timed(name) else { return .unavailable("missing symbol bench_c_\(name)") }
    return .run { count in
      var extra = [Double](repeating: 0, count: 4)
      for (index, value) in input.enumerated() { extra[index] = value }
      let value = extra.withUnsafeMutableBufferPointer { function(Int64(count), $0.baseAddress) }
      var sample = Sample(value: value)
      for (index, key) in extraKeys.enumerated() { sample.extras[key] = extra[index] }
      return sample
    }
  }

  var make: Make? { symbol("bench_c_make", as: Make.self) }

  /// `int64_t bench_c_heap_in_use(void)`: mallinfo2's bytes in use.
  var heapInUse: (@convention(c) () -> Int)? { symbol("bench_c_heap_in_use", as: (@convention(c) () -> Int).self) }
  /// `int64_t bench_c_usable_size(void *)`: malloc_usable_size.
  var usableSize: (@convention(c) (UnsafeMutableRawPointer?) -> Int)? {
    symbol("bench_c_usable_size", as: (@convention(c) (UnsafeMutableRawPointer?) -> Int).self)
  }
  var free: Free? { symbol("bench_c_free", as: Free.self) }
}

extension Optional where Wrapped == CLibrary {
  /// The C runner for `name`, or "not built" when the library is missing.
  func runner(_ name: String, extraKeys: [String] = [], input: [Double] = []) -> Runner {
    guard let library = self else { return .unavailable(CLibrary.missing) }
    return library.runner(name, extraKeys: extraKeys, input: input)
  }
}
