/// What `FileSystemSource` (an inotify watch) and the pressure sources share:
/// a kernel object the package watches on the user's behalf, whose events it
/// turns into flags merged into the user's DATA_OR source. (`ProcSource`'s
/// pidfd is a watch of the descriptor fence instead: `DescriptorWatch`.)
///
/// One shape for all: the watcher is made with its kernel object open and
/// its target attached (retained) in the user source's initializer; `start`
/// runs at the source's first `resume()` and begins delivery; `stop` runs
/// in the source's cancel path, closes the kernel object and releases the
/// target, exactly once however the two race. The phase lives under the
/// watcher's lock; C calls that the transitions ask for are made after the
/// lock is released.
protocol KernelWatcher: AnyObject, Sendable {
  /// Begins delivering events (the user source's first `resume()`).
  func start()
  /// Stops watching, closes the kernel object and releases the target (the
  /// user source's cancel handler). Later calls do nothing.
  func stop()
}

/// A watcher's phase: `idle` from creation until `start`, `running` while
/// it delivers (with what running needs), `stopped` once its kernel object
/// is closed.
enum WatcherPhase<Running> {
  case idle
  case running(Running)
  case stopped
}

/// The user's DATA_OR source as a watcher holds it: retained from the
/// watcher's creation until it stops.
struct MergeTarget: @unchecked Sendable {  // a libdispatch source, which is thread-safe
  let source: OpaquePointer

  /// Takes a reference to `source`; `release()` gives it back.
  init(retaining source: OpaquePointer) {
    Libdispatch.retain(source)
    self.source = source
  }

  /// Merges (ORs) `flags` into the source: one event for its handler.
  func merge(_ flags: UInt) {
    if flags != 0 { Libdispatch.source_merge_data(source, flags) }
  }

  func release() { Libdispatch.release(source) }
}

extension Source {
  /// The DATA_OR C source a kernel watcher merges into. Should libdispatch
  /// refuse it, `descriptor` (the kernel object the watcher was to own) is
  /// closed before the error is thrown.
  static func createWatcherTarget(queue: Queue, closingOnFailure descriptor: Int32) throws(GCDError)
    -> OpaquePointer
  {
    do {
      return try create(.dataOr, queue: queue)
    } catch {
      system_close(descriptor)
      throw error
    }
  }
}
