import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// What a subclass is given by its superclass, used through the superclass's type: the handler
/// set on the base gets the event's value, the sequence made from the base yields it, and the
/// value is the subclass's `data`.
private func firstValues<Value: Sendable & Equatable>(
  _ source: Source, setHandler: (@escaping @Sendable (Value) -> Void) -> Void,
  read: @escaping @Sendable () -> Value, trigger: () -> Void
) async -> (handled: Value, read: Value)? {
  let seen = Mutex<(handled: Value, read: Value)?>(nil)
  setHandler { value in
    let now = read()
    seen.withLock { if $0 == nil { $0 = (value, now) } }
  }
  source.resume()
  trigger()
  let arrived = await eventually { seen.withLock { $0 != nil } }
  source.cancel()
  return arrived ? seen.withLock { $0 } : nil
}

/// `ValueSource`, the superclass of the sources whose event carries a plain `UInt`.
@Suite
struct ValueSourceTests {
  @Test("through ValueSource, each data source's handler gets its merged value, the source's data")
  func handlerThroughTheBase() async {
    let cases: [(ValueSource, merge: (UInt) -> Void, merged: [UInt], expected: UInt)] = {
      let add = DataAddSource(queue: Queue(label: "family.add"))
      let or = DataOrSource(queue: Queue(label: "family.or"))
      let replace = DataReplaceSource(queue: Queue(label: "family.replace"))
      return [
        (add, add.merge, [5], 5), (or, or.merge, [0b110], 0b110), (replace, replace.merge, [9], 9),
      ]
    }()
    for (source, merge, merged, expected) in cases {
      let values = await firstValues(
        source, setHandler: { source.setEventHandler($0) }, read: { [unowned source] in source.data },
        trigger: { merged.forEach(merge) })
      #expect(values?.handled == expected, "\(type(of: source))")
      #expect(values?.read == expected, "\(type(of: source)): data in the handler")
    }
  }

  @Test("through ValueSource.makeEvents: a one-shot timer yields 1; leaving the loop cancels it")
  func eventsThroughTheBase() async throws {
    let timer = TimerSource(queue: Queue(label: "family.timer"))
    timer.schedule(start: .now)
    let base: ValueSource = timer
    var fires: [UInt] = []
    for try await count in base.makeEvents() {
      fires.append(count)
      break
    }
    #expect(fires == [1])
    #expect(timer.isCancelled, "leaving the loop cancels the source")
  }
}

/// `EventSetSource`, the superclass of the sources whose event carries a set of flags.
@Suite
struct EventSetSourceTests {
  @Test("through EventSetSource<ProcEvents>: the handler and firedEvents in it say .exit")
  func processThroughTheBase() async throws {
    let child = try spawnProcess("/bin/sh", ["-c", "exit 0"])
    let base: EventSetSource<ProcEvents> = try ProcSource(pid: child, queue: Queue(label: "family.proc"))
    let values = await firstValues(
      base, setHandler: { base.setEventHandler($0) }, read: { [unowned base] in base.firedEvents },
      trigger: {})
    #expect(values?.handled == .exit)
    #expect(values?.read == .exit)
    #expect(reapProcess(child) == 0)
  }

  @Test("through EventSetSource<FileSystemEvents>: a write's events in the handler and in firedEvents")
  func fileThroughTheBase() async throws {
    let directory = TemporaryDirectory()
    let path = directory.file("watched")
    let descriptor = open(path, O_WRONLY | O_CLOEXEC)
    try #require(descriptor >= 0)
    defer {
      close(descriptor)
      withExtendedLifetime(directory) {}  // removed on deinit: not before the source is done
    }
    let base: EventSetSource<FileSystemEvents> = try FileSystemSource(
      path: path, events: [.write], queue: Queue(label: "family.fs"))
    let values = await firstValues(
      base, setHandler: { base.setEventHandler($0) }, read: { [unowned base] in base.firedEvents },
      trigger: { #expect(write(descriptor, "data", 4) == 4) })
    #expect(values?.handled == .write)
    #expect(values?.read == .write)
  }

  @Test("through EventSetSource<ProcEvents>.makeEvents: .exit first; leaving the loop cancels the source")
  func eventsThroughTheBase() async throws {
    let child = try spawnProcess("/bin/sh", ["-c", "exit 0"])
    defer { _ = reapProcess(child) }
    let base: EventSetSource<ProcEvents> = try ProcSource(pid: child, queue: Queue(label: "family.events"))
    var fired: [ProcEvents] = []
    for try await events in base.makeEvents() {
      fired.append(events)
      break
    }
    #expect(fired == [.exit])
    #expect(base.isCancelled, "leaving the loop cancels the source")
  }
}
