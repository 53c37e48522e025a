/// The one table of the places where the package differs from libdispatch on purpose. A run maps
/// each such difference to a common observation tagged with its row (`tag`), so that the two sides
/// compare equal there and nowhere else; docs/reliability.md ("Intended differences from
/// libdispatch") lists the same rows, and `IntendedDifferencesTests` checks the two agree.
enum IntendedDifference: String, CaseIterable, Sendable {
  case badDescriptorThrows
  case brokenPipeIsEPIPE
  case safeDrop
  case cancelCompletes
  case cancelHandlerOnce
  case dropStopsReads
  case noEventHandlerClear
  case eventWithoutHandler
  case smallReadsAtOnce
  case cleanupGetsDescriptor

  /// What `import Dispatch` does.
  var dispatch: String {
    switch self {
    case .badDescriptorThrows:
      "`DispatchSource.makeReadSource`/`makeWriteSource` on a descriptor that is not open returns a source that never fires"
    case .brokenPipeIsEPIPE: "a write to a pipe or socket whose reader is gone raises SIGPIPE, which kills the process"
    case .safeDrop: "releasing a source that is suspended or was never resumed traps (`_dispatch_queue_xref_dispose`)"
    case .cancelHandlerOnce:
      "a cancel handler set after the source's cancellation completed runs too: a source's cancel handlers can run twice"
    case .cancelCompletes:
      "`cancel()` of a suspended or never-resumed source runs its cancel handler only after the matching `resume()`s"
    case .dropStopsReads:
      "a channel released without `close` keeps its pending reads waiting (and the descriptor held) until end of file"
    case .eventWithoutHandler:
      "a started read or write source whose event finds no handler can stay silent when a handler is set later, bytes still queued included (seen: a read source at the socket's end, or with bytes while a write source shares the descriptor; a write source after the peer closed)"
    case .noEventHandlerClear: "`setEventHandler(handler: nil)` removes the handler: events find none and are dropped"
    case .cleanupGetsDescriptor:
      "a channel's cleanup handler receives an errno value (0, or `ECANCELED` after a stop)"
    case .smallReadsAtOnce:
      "a stream channel's reads start at a low-water mark of one chunk (1 MiB): a smaller read delivers nothing until it is complete or the stream ends"
    }
  }

  /// What the package does instead.
  var gcd: String {
    switch self {
    case .badDescriptorThrows: "`ReadSource`/`WriteSource` init throws `GCDError` with `EBADF`"
    case .brokenPipeIsEPIPE:
      "the first channel installs a do-nothing SIGPIPE handler (if the disposition is the default): the write fails with `EPIPE`"
    case .safeDrop: "dropping a source in any state cancels it and balances its suspensions and activation"
    case .cancelHandlerOnce: "a source's cancel handler runs once; one set after that never runs"
    case .cancelCompletes:
      "`cancel()` balances the outstanding suspensions and starts a never-started source: the cancel handler does not wait; later `suspend()`/`resume()` calls are not the user's to balance"
    case .dropStopsReads: "dropping a channel ends its pending reads with `ECANCELED` and lets its writes finish"
    case .eventWithoutHandler:
      "the handler set later runs: it reads the bytes and the end, or its write fails with `EPIPE` (the fence re-arms whatever the handler)"
    case .noEventHandlerClear: "no call clears an event handler; a user sets one that does nothing"
    case .smallReadsAtOnce:
      "a stream channel's reads start at a low-water mark of 1 byte: each read delivers what arrives"
    case .cleanupGetsDescriptor: "a channel's cleanup receives the descriptor, to close it there"
    }
  }

  /// Why the package differs.
  var reason: String {
    switch self {
    case .badDescriptorThrows: "a silent source is a bug found late; an error at the call is found at once"
    case .brokenPipeIsEPIPE:
      "a peer that goes away must not kill a server (libdispatch's Darwin suppression does not exist on Linux)"
    case .safeDrop: "RAII: a wrapper can be dropped in any state without crashing or leaking"
    case .cancelHandlerOnce:
      "the cancel handler is where a descriptor is closed: a second run would close a reused number"
    case .cancelCompletes: "a cancel handler that closes a descriptor must not wait for a resume that may never come"
    case .dropStopsReads: "a dropped channel must not hold its descriptor for a peer that never writes"
    case .eventWithoutHandler:
      "issue 38's first defect, fixed at its shape: the re-arm does not depend on a block the user controls"
    case .noEventHandlerClear: "a handler is a non-optional closure in the package's API"
    case .smallReadsAtOnce: "with one chunk, a request/response protocol looks hung"
    case .cleanupGetsDescriptor: "the cleanup is where a descriptor passed in is closed (docs/io.md)"
    }
  }

  /// How a run maps it: the oracle is made to do what the package does, or both sides report one
  /// common observation.
  var mapping: String {
    switch self {
    case .badDescriptorThrows:
      "the Dispatch run looks at the number first (`F_GETFD`); both sides observe `unusable EBADF`, and the slot takes no further part"
    case .brokenPipeIsEPIPE:
      "the test process catches SIGPIPE with a do-nothing handler before any run, so the Dispatch write fails with `EPIPE` too"
    case .safeDrop:
      "the Dispatch run's drop cancels, then resumes as often as the source is suspended (and once more if never resumed), then releases"
    case .cancelHandlerOnce: "no sequence sets a cancel handler on a cancelled source"
    case .cancelCompletes:
      "the Dispatch run's cancel resumes as the drop does; no sequence suspends or resumes a cancelled source"
    case .dropStopsReads:
      "the Dispatch run's drop of a channel with a pending read closes it with `.stop` when no write is pending; a read a drop left waiting ends as `ended by drop` on both sides"
    case .eventWithoutHandler:
      "once a started read source with no handler had bytes or the end to report (a write source: the end, or the peer's close), until the number is reused: no run waits for such events; what was read, the end and write errors are not compared; a handler that meets the end suspends its source instead of cancelling it"
    case .noEventHandlerClear: "the GCD run's clear sets an empty handler; neither side records an event for it"
    case .cleanupGetsDescriptor:
      "the GCD run checks its cleanup got the descriptor; the Dispatch run's errno is not compared; both report the verdict"
    case .smallReadsAtOnce:
      "the Dispatch run sets a low-water mark of 1 on each new stream channel, as the package does, before the sequence's own `setLimit`"
    }
  }

  /// The tag a run puts on an observation this row maps.
  var tag: String { "[intended: \(rawValue)]" }
}

extension IntendedDifference {
  /// The table as docs/reliability.md shows it, row for row (`IntendedDifferencesTests` checks the
  /// page holds exactly this text).
  static var markdownTable: String {
    var table = "| Row | `import Dispatch` | GCD | Why | How a run maps it |\n|---|---|---|---|---|\n"
    for row in allCases {
      table += "| `\(row.rawValue)` | \(row.dispatch) | \(row.gcd) | \(row.reason) | \(row.mapping) |\n"
    }
    return table
  }
}
