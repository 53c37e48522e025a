import GCD
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// The error and misuse policy of docs/architecture.md ("Errors and misuse"), checked: every public
// throwing API by its error type, and the stops of the misuse rule.

/// The error type `function` is declared to throw (inferred from the reference: no conversion). One
/// overload per arity in use: a parameter pack here crashes the compiler (6.3) on the closure
/// parameter of `IOChannel(path:…)`.
private func thrownType<Result, Failure: Error>(of _: () async throws(Failure) -> Result) -> any Error.Type {
  Failure.self
}
private func thrownType<A, Result, Failure: Error>(of _: (A) async throws(Failure) -> Result) -> any Error.Type {
  Failure.self
}
private func thrownType<A, B, Result, Failure: Error>(of _: (A, B) async throws(Failure) -> Result) -> any Error.Type {
  Failure.self
}
private func thrownType<A, B, C, Result, Failure: Error>(
  of _: (A, B, C) async throws(Failure) -> Result
) -> any Error.Type {
  Failure.self
}
private func thrownType<A, B, C, D, F, G, Result, Failure: Error>(
  of _: (A, B, C, D, F, G) async throws(Failure) -> Result
) -> any Error.Type {
  Failure.self
}

/// The error type an async sequence's iteration throws.
private func failureType<Sequence: AsyncSequence>(of _: Sequence.Type) -> any Error.Type { Sequence.Failure.self }

/// A public declaration of `Sources/GCD` (outside `Internals/`) that throws, and what it declares.
struct ThrowingDeclaration: CustomStringConvertible {
  let file: String
  let header: String
  /// `GCDError`, `CancellationError`, a generic parameter's name, `rethrows`, or `any Error` (untyped).
  let thrown: String
  let genericParameters: [String]
  var description: String { "\(file): \(header) -> \(thrown)" }
}

/// Every public declaration in Sources/GCD (not Internals/) whose own effects say `throws` or
/// `rethrows`: the parameter list is skipped (a closure parameter that throws is not the API
/// throwing), and a property's `get async throws` accessor counts.
func publicThrowingDeclarations() -> [ThrowingDeclaration] {
  let root = "\(#filePath)".split(separator: "/").dropLast(3).joined(separator: "/")
  let sources = "/\(root)/Sources/GCD"
  var found: [ThrowingDeclaration] = []
  for path in swiftFiles(under: sources, relativeTo: "") where !path.hasPrefix("Internals/") {
    let text = String(decoding: contentsOfFile("\(sources)/\(path)"), as: UTF8.self)
    let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    for (index, line) in lines.enumerated() {
      let trimmed = String(line.drop { $0 == " " })
      guard !trimmed.hasPrefix("//"), trimmed.contains("public "),
        let keyword = ["func ", "init(", "init<", "var ", "subscript("].first(where: { trimmed.contains($0) })
      else { continue }
      // The header: up to the body's `{` (parentheses and angle brackets balanced), over several lines.
      var header = ""
      var depth = 0
      var next = index
      scan: while next < lines.count {
        for character in lines[next] {
          if character == "(" || character == "<" { depth += 1 }
          if character == ")" || (character == ">" && !header.hasSuffix("-")) { depth -= 1 }
          if character == "{" && depth == 0 { break scan }
          header.append(character)
        }
        header.append(" ")
        next += 1
      }
      var effects = header
      if let name = header.firstRange(of: keyword) {
        // What follows the parameter list: skip to its closing parenthesis.
        var level = 0
        var afterParameters = header.endIndex
        var opened = false
        var position = name.lowerBound
        while position < header.endIndex {
          let character = header[position]
          if character == "(" {
            level += 1
            opened = true
          }
          if character == ")" {
            level -= 1
            if opened && level == 0 {
              afterParameters = header.index(after: position)
              break
            }
          }
          position = header.index(after: position)
        }
        effects = keyword == "var " ? "" : String(header[afterParameters...])
      }
      if keyword == "var ", next + 1 < lines.count {
        let accessor = String(lines[next + 1].drop { $0 == " " })
        if accessor.hasPrefix("get ") { effects = accessor }
      }
      let thrown: String
      if let typed = effects.firstMatch(of: /throws\((\w+)\)/) {
        thrown = String(typed.1)
      } else if effects.contains(/\brethrows\b/) {
        thrown = "rethrows"
      } else if effects.contains(/\bthrows\b/) {
        thrown = "any Error"
      } else {
        continue
      }
      var generics: [String] = []
      if let open = header.firstIndex(of: "<"), let close = header[open...].firstIndex(of: ">") {
        generics = header[header.index(after: open)..<close].split(separator: ",").map {
          String($0.split(separator: ":")[0].filter { $0 != " " })
        }
      }
      let compact = header.split(whereSeparator: \.isWhitespace).joined(separator: " ")
      found.append(ThrowingDeclaration(file: path, header: compact, thrown: thrown, genericParameters: generics))
    }
  }
  return found
}

/// The `.swift` files under `directory`, as paths relative to it, in its subfolders too (not the
/// DocC catalog).
private func swiftFiles(under directory: String, relativeTo prefix: String) -> [String] {
  guard let listing = opendir(directory) else { return [] }
  defer { closedir(listing) }
  var files: [String] = []
  while let entry = readdir(listing) {
    let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
    if name.hasPrefix(".") || name.hasSuffix(".docc") { continue }
    if name.hasSuffix(".swift") {
      files.append(prefix + name)
    } else if entry.pointee.d_type == UInt8(DT_DIR) {
      files += swiftFiles(under: "\(directory)/\(name)", relativeTo: "\(prefix)\(name)/")
    }
  }
  return files
}

@Suite("Error policy")
struct ErrorPolicyTests {
  /// The untyped exceptions the rule allows, each with its reason.
  static let untyped: [(file: String, name: String, reason: String)] = [
    (
      "SignalSource+Scoped.swift", "withSignals",
      "runs the caller's closure, which throws what it throws, beside the GCDError of registering the signals"
    )
  ]

  @Test(
    "every public throwing API declares a typed error the rule allows: GCDError, CancellationError, or its closure's")
  func everyThrowingAPIIsTyped() throws {
    let declarations = publicThrowingDeclarations()
    // The scan finds the APIs listed in `listedAPIs`, so it cannot pass by finding nothing.
    #expect(declarations.count >= 25, "\(declarations)")
    for declaration in declarations {
      switch declaration.thrown {
      case "GCDError", "CancellationError", "rethrows": continue
      case "any Error":
        let allowed = Self.untyped.contains {
          declaration.file.hasSuffix($0.file) && declaration.header.contains($0.name)
        }
        #expect(allowed, "untyped throws: \(declaration)")
      default:
        // A generic error parameter: the error of the caller's closure, passed through.
        #expect(
          declaration.genericParameters.contains(declaration.thrown), "not an error type of the rule: \(declaration)")
      }
    }
  }

  /// Each public throwing API, by a reference whose error type is inferred, against the rule: errno
  /// failures (and the cancellation of an I/O await, `ECANCELED`) throw `GCDError`; an await that can
  /// only be cancelled throws `CancellationError`; the closure-running calls throw the closure's error.
  @Test("each listed API throws the type the rule gives it; the scan finds each of them")
  func listedAPIs() throws {
    let queue = Queue(label: "error-policy")
    let channel = IOChannel(fileDescriptor: -1, type: .stream, queue: queue) { _ in }
    let semaphore = try Semaphore(value: 1)
    let listed: [(file: String, name: String, thrown: any Error.Type, expected: any Error.Type)] = [
      ("Semaphore.swift", "init(value:", thrownType(of: Semaphore.init(value:)), GCDError.self),
      ("ProcSource.swift", "init(pid:", thrownType(of: ProcSource.init(pid:events:queue:)), GCDError.self),
      ("SignalSource.swift", "init(signal:", thrownType(of: SignalSource.init(signal:queue:)), GCDError.self),
      (
        "ReadSource.swift", "init(fileDescriptor:", thrownType(of: ReadSource.init(fileDescriptor:queue:)),
        GCDError.self
      ),
      (
        "WriteSource.swift", "init(fileDescriptor:", thrownType(of: WriteSource.init(fileDescriptor:queue:)),
        GCDError.self
      ),
      (
        "FileSystemSource.swift", "init(path:", thrownType(of: FileSystemSource.init(path:events:queue:)),
        GCDError.self
      ),
      (
        "FileSystemSource.swift", "init(fileDescriptor:",
        thrownType(of: FileSystemSource.init(fileDescriptor:events:queue:)), GCDError.self
      ),
      (
        "MemoryPressureSource.swift", "init(", thrownType(of: MemoryPressureSource.init(events:scope:queue:)),
        GCDError.self
      ),
      (
        "PressureSource.swift", "init(",
        thrownType(of: PressureSource.init(resource:stall:threshold:window:scope:queue:)), GCDError.self
      ),
      (
        "IOChannel.swift", "init( path:", thrownType(of: IOChannel.init(path:flags:mode:type:queue:cleanup:)),
        GCDError.self
      ),
      ("IOChannel+Async.swift", "read(upTo", thrownType(of: channel.read(upTo:)), GCDError.self),
      (
        "IOChannel+Async.swift", "write(_ data: DispatchBuffer)",
        thrownType(of: channel.write as (DispatchBuffer) async throws(GCDError) -> Void), GCDError.self
      ),
      (
        "IOChannel+Async.swift", "write(_ bytes: [UInt8])",
        thrownType(of: channel.write as ([UInt8]) async throws(GCDError) -> Void), GCDError.self
      ),
      ("IOChannel+Async.swift", "next()", failureType(of: IOChannel.Chunks.self), GCDError.self),
      ("SourceEvents.swift", "next()", failureType(of: SourceEvents<UInt>.self), GCDError.self),
      (
        "Group.swift", "wait() async",
        thrownType { () async throws(CancellationError) in try await Group().wait() }, CancellationError.self
      ),
      (
        "Semaphore.swift", "wait() async",
        thrownType { () async throws(CancellationError) in try await semaphore.wait() },
        CancellationError.self
      ),
      (
        "WorkItem.swift", "var finished",
        thrownType { () async throws(CancellationError) in try await WorkItem {}.finished }, CancellationError.self
      ),
    ]
    let declarations = publicThrowingDeclarations()
    for api in listed {
      let (thrown, expected) = (ObjectIdentifier(api.thrown), ObjectIdentifier(api.expected))
      #expect(thrown == expected, "\(api.file) \(api.name): throws \(api.thrown), the rule says \(api.expected)")
      let match = declarations.first { $0.file.hasSuffix(api.file) && $0.header.contains(api.name) }
      #expect(match != nil, "the scan did not find \(api.file) \(api.name)")
      if let match { #expect(match.thrown == "\(api.expected)", "\(match)") }
    }
    // The closure-running calls pass the closure's error type through.
    struct Failure: Error {}
    let run = thrownType { () async throws(Failure) in try await queue.run { () throws(Failure) in } }
    #expect(ObjectIdentifier(run) == ObjectIdentifier(Failure.self))
    #expect(throws: Failure.self) { try queue.sync { () throws(Failure) in throw Failure() } }
  }

  @Test("a cancelled I/O await throws GCDError with ECANCELED, which one `catch let error as GCDError` covers")
  func cancelledIOThrowsECANCELED() async throws {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    defer { close(writeEnd) }
    let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: .global()) { _ = close($0) }
    let started = Event()
    let reader = Task { () async throws(GCDError) -> DispatchBuffer in
      started.signal()
      return try await channel.read(upTo: 10)
    }
    while !started.isSignaled { await Task.yield() }
    reader.cancel()
    let error = await #expect(throws: GCDError.self) { try await reader.value }
    #expect(error?.errno == ECANCELED)
    #expect(error?.detail == "the task was cancelled")
    #expect(error?.operation == "IOChannel.read(upTo: 10)")
  }
}

@Suite("Misuse policy")
struct MisusePolicyTests {
  @Test("a QoS class libdispatch does not know stops Queue(label:qos:) with a message naming the queue")
  func queueUnknownQoSStops() async {
    let unknown = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      _ = Queue(label: "policy.class", kind: .concurrent, qos: Queue.QoS(rawClass: 0x7))
    }
    let unknownText = standardError(of: unknown)
    #expect(unknownText.contains("GCD: Queue(label: \"policy.class\", qos: class 0x7, relative 0)"), "\(unknownText)")
  }

  @Test("a relative priority out of range is clamped by QoS, so it reaches libdispatch as -15")
  func clampedQoSIsAccepted() {
    for qos in [Queue.QoS.utility.relative(-40), Queue.QoS(rawClass: 0x11, relativePriority: -16)] {
      #expect(qos.relativePriority == -15)
      #expect(Queue(label: "policy.clamped", qos: qos).qos == qos)
    }
  }

  @Test("unknown option bits stop with a message naming the object: TimerSource, WorkItem, ProcSource alike")
  func unknownBitsStopEverywhere() async {
    let timer = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      _ = TimerSource(queue: .global(), flags: TimerSource.Flags(rawValue: 0x2))
    }
    #expect(standardError(of: timer).contains("GCD: TimerSource(flags: [0x2])"), "\(standardError(of: timer))")
    let item = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      _ = WorkItem(flags: WorkItem.Flags(rawValue: 0x100)) {}
    }
    #expect(standardError(of: item).contains("GCD: WorkItem(flags: [0x100])"), "\(standardError(of: item))")
    let proc = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      _ = try? ProcSource(pid: getpid(), events: ProcEvents(rawValue: 0x2), queue: .global())
    }
    #expect(standardError(of: proc).contains("GCD: ProcSource(pid: "), "\(standardError(of: proc))")
  }

  @Test("input the caller may get at run time still throws GCDError: a pid below 1, a negative semaphore value")
  func badInputThrows() {
    #expect(throws: GCDError.self) { try ProcSource(pid: 0, queue: .global()) }
    #expect(throws: GCDError.self) { try Semaphore(value: -1) }
  }
}
