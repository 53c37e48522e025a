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
  case writeCancelKeepsReads
  case readerAfterFullWriter
  case smallReadsAtOnce
  case cleanupGetsDescriptor
  case errorEndsOneOperation
  case readsBesideWrites
  case reopenAfterEnd
  case closedReaderEndsWrite
  case hungUpTerminalEndsWrite
  case stopWaitsForBarrier
  case barrierPerDescriptor

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
      "a started read or write source whose event found no handler can stay silent once a handler is set, queued bytes included (a read source at the socket's end, or beside a write source; a write source after the peer closed)"
    case .writeCancelKeepsReads:
      "cancelling a write source silences the read sources on the same descriptor number: their later events never come (a read source's cancel leaves a write source alone)"
    case .readerAfterFullWriter:
      "a read source started on a socket that a write source's handler filled (until `EAGAIN`) never fires, queued bytes included (`make reader-probe` shows it in C)"
    case .noEventHandlerClear: "`setEventHandler(handler: nil)` removes the handler: events find none and are dropped"
    case .cleanupGetsDescriptor:
      "a channel's cleanup handler receives an errno value (0, or `ECANCELED` after a stop)"
    case .smallReadsAtOnce:
      "a stream channel's reads start at a low-water mark of one chunk (1 MiB): a smaller read delivers nothing until it is complete or the stream ends"
    case .errorEndsOneOperation:
      "an operation that fails with `EBADF` (a read on a pipe's write-only end) fails every other operation of the descriptor's channels, pending or later, while its record lives (io.c keeps the error per descriptor)"
    case .readsBesideWrites:
      "a socket channel's read waits, bytes or the end queued, while a write of the socket is pending (both directions share one record and epoll registration: docs/io.md)"
    case .reopenAfterEnd:
      "a channel made over a descriptor while its closed channels' record is still ending can take that record's `O_NONBLOCK` for the caller's flags and restore it: the descriptor is left non-blocking"
    case .closedReaderEndsWrite:
      "a write waiting for room in a pipe whose reader then closes never ends (no `EPIPE`), nor do the writes queued behind it, until a stop ends them with `ECANCELED`"
    case .hungUpTerminalEndsWrite:
      "a write to a pseudo-terminal's master whose slave closed, once the terminal is full (about 14 KB), never ends, nor do the writes behind it, until a stop ends them with `ECANCELED` (reads end with `EIO`)"
    case .stopWaitsForBarrier:
      "`close(flags: .stop)` after a barrier that waits for a pending operation waits behind it: a read that gets no bytes is not stopped until the stream ends"
    case .barrierPerDescriptor:
      "a stream channel's barrier waits for, and holds back, the operations and stops of every channel over the descriptor (one barrier queue and group per descriptor, io.c)"
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
      "`cancel()` balances the outstanding suspensions and starts a never-started source: the cancel handler does not wait; later `suspend()`/`resume()` calls need no balancing"
    case .dropStopsReads: "dropping a channel ends its pending reads with `ECANCELED` and lets its writes finish"
    case .eventWithoutHandler:
      "the handler set later runs: it reads the bytes and the end, or its write fails with `EPIPE` (the fence re-arms whatever the handler)"
    case .writeCancelKeepsReads:
      "a source's cancel leaves the other sources on the descriptor as they were"
    case .readerAfterFullWriter:
      "the read source fires for the bytes queued, and for each later arrival"
    case .noEventHandlerClear: "no call clears an event handler; a user sets one that does nothing"
    case .smallReadsAtOnce:
      "a stream channel's reads start at a low-water mark of 1 byte: each read delivers what arrives"
    case .cleanupGetsDescriptor: "a channel's cleanup receives the descriptor, to close it there"
    case .errorEndsOneOperation:
      "only the operation that met the error ends with it; the descriptor's other operations go on"
    case .readsBesideWrites:
      "a socket channel reads and writes at once, each direction on its own source: a read delivers while a long write waits for room"
    case .reopenAfterEnd:
      "the record (`StreamDescriptor`) restores the flags under its table's lock: a channel made meanwhile reads the caller's flags, restored when its own last channel ends"
    case .closedReaderEndsWrite: "the write ends with `EPIPE`, and so do the writes behind it"
    case .hungUpTerminalEndsWrite: "the write ends with `EIO`, as the reads do, and so do the writes behind it"
    case .stopWaitsForBarrier:
      "`close(stop: true)` ends every pending operation at once with `ECANCELED`, those before a barrier included; the barrier then runs"
    case .barrierPerDescriptor:
      "a barrier waits for its own channel's operations and holds its own channel's later ones, as `dispatch_io_barrier`'s documentation says"
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
      "a source must not go silent because its handler came late: the re-arm does not depend on a block the user controls"
    case .writeCancelKeepsReads:
      "a connection's writer ends before its reader; its reads must go on"
    case .readerAfterFullWriter:
      "a connection whose writer filled the socket before its reader started must still read (the fence registers each descriptor once, for every direction a live watch wants)"
    case .noEventHandlerClear: "a handler is a non-optional closure in the package's API"
    case .smallReadsAtOnce: "with one chunk, a request/response protocol looks hung"
    case .cleanupGetsDescriptor: "the cleanup is where a descriptor passed in is closed (docs/io.md)"
    case .errorEndsOneOperation:
      "an error in one direction says nothing of the other: a write-only end still writes after a read on it failed"
    case .readsBesideWrites:
      "a peer that reads only after it has sent stalls a channel that cannot read while it writes (docs/io.md, \"One channel reading and writing a socket at once\")"
    case .reopenAfterEnd:
      "a descriptor handed back to its owner must have its flags as they were"
    case .closedReaderEndsWrite: "a writer must learn that its reader went away rather than wait for good"
    case .hungUpTerminalEndsWrite:
      "the hang-up wakes the write registration again and again: the engine must end the write or spin a core"
    case .stopWaitsForBarrier: "a stop is how a caller gets out of an operation that may wait for good"
    case .barrierPerDescriptor:
      "a channel that reads a socket must not wait for a write another channel over it has pending, nor stop waiting when its own barrier would"
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
      "the Dispatch run's drop of a channel with a pending read and no pending write closes it with `.stop`; a read a drop left waiting ends as `ended by drop` on both sides; while the Dispatch run may still hold such a read, steps where the peer writes or the number is reused are skipped on both sides, with the row's tag"
    case .eventWithoutHandler:
      "from when a started source with no handler had bytes or an end to report (a write source: the peer's close) until the number is reused, no run waits for such events, and reads, ends and write errors are not compared; a handler meeting the end suspends its source instead of cancelling it"
    case .writeCancelKeepsReads:
      "once a write source is cancelled or dropped while a read source on its number is live, until the number is reused, the runs compare reads as `eventWithoutHandler` does"
    case .readerAfterFullWriter:
      "once a read source starts on a number whose live write source's handler filled the socket, until the number is reused, the runs compare reads as `eventWithoutHandler` does"
    case .noEventHandlerClear: "the GCD run's clear sets an empty handler; neither side records an event for it"
    case .cleanupGetsDescriptor:
      "the GCD run checks its cleanup got the descriptor; the Dispatch run's errno is not compared; both report the verdict"
    case .smallReadsAtOnce:
      "the Dispatch run sets a low-water mark of 1 on each new stream channel, as the package does, before the sequence's own `setLimit`"
    case .errorEndsOneOperation:
      "the one failing operation (a read on a pipe's write end, a write on its read end) is issued only while nothing else is pending; every later read or write step is skipped on both sides, with the row's tag"
    case .readsBesideWrites:
      "while a socket write is pending (it does not fit until the peer reads), reads, the peer's writes, and its shutdown or close while a read waits are skipped on both sides, with the row's tag"
    case .reopenAfterEnd:
      "before a channel over a descriptor whose earlier channels are all closed and idle, the Dispatch run waits for their cleanups and the flags to be back; the GCD run does not"
    case .closedReaderEndsWrite:
      "no run waits for a write pending (or queued behind one) on a pipe whose reader closed; at the end each checks its own errno (GCD: `EPIPE`; Dispatch: `EPIPE`, or `ECANCELED` from the teardown's stop) and both report the verdict with the row's tag"
    case .hungUpTerminalEndsWrite:
      "a terminal write issued or pending after the slave closed is checked as in `closedReaderEndsWrite` (GCD: done or `EIO`; Dispatch: done, or `ECANCELED` from the teardown's stop); after it, reads and barriers are skipped on both sides, with the row's tag"
    case .stopWaitsForBarrier:
      "a `close(stop: true)` of a channel (and a reuse of the number, which stops every channel) while one of its barriers waits for an operation is skipped on both sides, with the row's tag"
    case .barrierPerDescriptor:
      "a barrier is issued only while no other channel over the descriptor has an operation pending, and no other channel reads or writes while it waits; a stop while any barrier waits is skipped (`stopWaitsForBarrier`); all on both sides, with the row's tag"
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
