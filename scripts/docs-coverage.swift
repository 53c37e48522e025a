// Fails when the DocC site leaves a public symbol or an article uncurated.
//
//   swift scripts/docs-coverage.swift <symbol-graph-dir> <catalog.docc> <docc-output-dir>
//
// Reads the module's symbol graphs (what the public surface is) and the built site's render JSON
// (what the Topics sections curate). Every top-level public symbol (type, protocol, global function)
// and every extended external type (`Swift/Duration`) must be listed in a Topics group of the
// landing page, or of an article the landing page curates; every article file in the catalog must be
// reachable the same way. A symbol DocC had to put into a generated group ("Classes",
// "Structures", …) is uncurated. Members are curated by DocC on their type's page.
// Only the Swift toolchain is needed (Foundation's JSONSerialization).
import Foundation

let arguments = CommandLine.arguments
guard arguments.count == 4 else {
  FileHandle.standardError.write(
    "usage: swift scripts/docs-coverage.swift <symbol-graph-dir> <catalog.docc> <docc-output-dir>\n"
      .data(using: .utf8)!)
  exit(2)
}
let graphDirectory = URL(fileURLWithPath: arguments[1])
let catalog = URL(fileURLWithPath: arguments[2])
let output = URL(fileURLWithPath: arguments[3])
let files = FileManager.default

func fail(_ message: String) -> Never {
  FileHandle.standardError.write("docs-coverage: \(message)\n".data(using: .utf8)!)
  exit(1)
}

func json(_ url: URL) -> [String: Any] {
  guard let data = try? Data(contentsOf: url),
    let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
  else { fail("cannot read \(url.path)") }
  return object
}

// The public surface, from the symbol graphs: `GCD.symbols.json` holds the module's own symbols,
// `GCD@Swift.symbols.json` (and any other `GCD@X`) the extensions of other modules' types.
let graphs = ((try? files.contentsOfDirectory(atPath: graphDirectory.path)) ?? []).filter {
  $0.hasSuffix(".symbols.json")
}
guard let mainGraph = graphs.first(where: { !$0.contains("@") }) else {
  fail("no module symbol graph in \(graphDirectory.path)")
}
let module = String(mainGraph.dropLast(".symbols.json".count))

var required: [String: String] = [:]  // render identifier -> what it is, for the message
for name in graphs {
  let graph = json(graphDirectory.appendingPathComponent(name))
  let relationships = graph["relationships"] as? [[String: Any]] ?? []
  let members = Set(
    relationships.filter {
      ["memberOf", "requirementOf", "optionalRequirementOf", "extensionTo"].contains(
        $0["kind"] as? String ?? "")
    }.compactMap { $0["source"] as? String })
  for symbol in graph["symbols"] as? [[String: Any]] ?? [] {
    let kind = (symbol["kind"] as? [String: Any])?["identifier"] as? String ?? ""
    let precise = (symbol["identifier"] as? [String: Any])?["precise"] as? String ?? ""
    let path = symbol["pathComponents"] as? [String] ?? []
    if name == mainGraph {
      guard !members.contains(precise), kind != "swift.extension" else { continue }
      required["doc://\(module)/documentation/\(module)/\(path.joined(separator: "/"))"] =
        "public \(kind.replacingOccurrences(of: "swift.", with: "")) \(path.joined(separator: "."))"
    } else if kind == "swift.extension" {
      // An extended type is curated by DocC on its extended module's page (`Swift`), which the
      // landing page curates; curating the type itself would leave that page empty and removed,
      // and the type page's breadcrumb pointing at nothing.
      let extended = String(name.dropFirst(module.count + 1).dropLast(".symbols.json".count))
      required["doc://\(module)/documentation/\(module)/\(extended)"] =
        "extended module \(extended) (\(extended).\(path.joined(separator: ".")))"
    }
  }
}
if required.isEmpty { fail("the symbol graphs in \(graphDirectory.path) list no public symbol") }

// The articles of the catalog (every Markdown file but the landing page; tutorials are not
// articles and are reached from their table of contents).
let enumerator = files.enumerator(at: catalog, includingPropertiesForKeys: nil)
while let file = enumerator?.nextObject() as? URL {
  guard file.pathExtension == "md" else { continue }
  let text = (try? String(contentsOf: file, encoding: .utf8)) ?? ""
  if text.hasPrefix("# ``") || text.contains("@Tutorials(") { continue }
  let base = file.deletingPathExtension().lastPathComponent
  required["doc://\(module)/documentation/\(module)/\(base)"] = "article \(file.lastPathComponent)"
}

// What the site curates: the landing page's Topics, and those of every article reached from them.
let data = output.appendingPathComponent("data/documentation")
func renderJSON(_ identifier: String) -> [String: Any]? {
  guard let range = identifier.range(of: "/documentation/") else { return nil }
  let path = String(identifier[range.upperBound...]).lowercased()
  let url = data.appendingPathComponent(path + ".json")
  return files.fileExists(atPath: url.path) ? json(url) : nil
}

let bundle = json(data.appendingPathComponent(module.lowercased() + ".json"))
let landingIdentifier = (bundle["identifier"] as? [String: Any])?["url"] as? String ?? ""
// The bundle identifier is the host of the landing page's identifier.
guard let host = URL(string: landingIdentifier)?.host else { fail("the landing page has no identifier") }
required = Dictionary(
  uniqueKeysWithValues: required.map {
    ($0.key.replacingOccurrences(of: "doc://\(module)/", with: "doc://\(host)/"), $0.value)
  })

var curated = Set<String>()
var generated: [String] = []
var pending = [landingIdentifier]
var visited = Set<String>()
while let identifier = pending.popLast() {
  guard visited.insert(identifier).inserted,
    let page = identifier == landingIdentifier ? bundle : renderJSON(identifier)
  else { continue }
  let kind = page["kind"] as? String ?? ""
  guard identifier == landingIdentifier || kind == "article" else { continue }
  for section in page["topicSections"] as? [[String: Any]] ?? [] {
    let identifiers = section["identifiers"] as? [String] ?? []
    if section["generated"] as? Bool == true {
      if identifier == landingIdentifier {
        generated.append("\(section["title"] as? String ?? "?"): \(identifiers.count) symbols")
      }
      continue
    }
    curated.formUnion(identifiers)
    pending.append(contentsOf: identifiers)
  }
}

let missing = required.filter { !curated.contains($0.key) }.map(\.value).sorted()
if !missing.isEmpty || !generated.isEmpty {
  for item in missing {
    FileHandle.standardError.write("docs-coverage: not curated in any Topics group: \(item)\n".data(using: .utf8)!)
  }
  for group in generated {
    FileHandle.standardError.write(
      "docs-coverage: the landing page has a generated group (\(group))\n".data(using: .utf8)!)
  }
  fail(
    "add each to a Topics group of \(catalog.lastPathComponent)/\(module).md (a symbol as ``Name``, an article as <doc:Name>)"
  )
}
print("docs-coverage: \(required.count) public symbols, extensions and articles, each curated in a Topics group")
