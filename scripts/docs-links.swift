// Checks the built DocC site's links without a browser (CI runs this; docs/site.md).
//
//   swift scripts/docs-links.swift <site> <Examples folder> [<pages file>]
//
// Reads every page of render JSON under <site>/data and fails when
//   - a page it references (a Topics entry, a symbol link, an article link, a "see also") has no
//     render JSON (data/…/name.json) or no HTML page (…/name/index.html) in the site;
//   - a relative link points at no file of the site;
//   - its text names an example that does not exist: `swift run Example<Name>` or
//     `Examples/<Name>/main.swift` without an Examples/<Name>/main.swift;
//   - the landing page reaches no article or no symbol page.
// With a third argument it writes there every page reachable from the landing page through Topics
// groups (landing page, articles, tutorials, symbol pages), one a line as its path, a tab and its
// title, for scripts/docs-check.sh to open in a browser. Only the Swift toolchain is needed.
import Foundation

let arguments = CommandLine.arguments
guard arguments.count == 3 || arguments.count == 4 else {
  FileHandle.standardError.write(
    "usage: swift scripts/docs-links.swift <site> <Examples folder> [<pages file>]\n".data(using: .utf8)!)
  exit(2)
}
let site = arguments[1]
let examples = arguments[2]
let files = FileManager.default
var problems: [String] = []

func exists(_ path: String) -> Bool { files.fileExists(atPath: site + "/" + path) }

// Every render JSON page, by its site path ("documentation/gcd/queue").
var pages: [String: [String: Any]] = [:]
let enumerator = files.enumerator(atPath: site + "/data")
while let path = enumerator?.nextObject() as? String {
  guard path.hasSuffix(".json"), let data = files.contents(atPath: site + "/data/" + path),
    let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
  else { continue }
  pages[String(path.dropLast(".json".count))] = object
}
guard !pages.isEmpty else {
  FileHandle.standardError.write("docs-links: no render JSON under \(site)/data: run make docs\n".data(using: .utf8)!)
  exit(1)
}

/// The site path of a reference URL ("/documentation/gcd/queue#Overview" -> "documentation/gcd/queue").
func sitePath(_ url: String) -> String {
  var path = url
  if let hash = path.firstIndex(of: "#") { path = String(path[..<hash]) }
  return String(path.drop(while: { $0 == "/" })).lowercased()
}

/// Every string in a JSON value.
func strings(in value: Any, into result: inout [String]) {
  switch value {
  case let string as String: result.append(string)
  case let array as [Any]: for element in array { strings(in: element, into: &result) }
  case let object as [String: Any]: for element in object.values { strings(in: element, into: &result) }
  default: break
  }
}

let examplePattern = try! NSRegularExpression(
  pattern: #"(?:swift run Example([A-Za-z0-9_]+)|Examples/([A-Za-z0-9_]+)/main\.swift)"#)
var checkedReferences = 0
var namedExamples = Set<String>()
for (page, object) in pages.sorted(by: { $0.key < $1.key }) {
  for case let reference as [String: Any] in (object["references"] as? [String: Any] ?? [:]).values {
    guard let url = reference["url"] as? String else { continue }
    switch reference["type"] as? String {
    case "topic":
      checkedReferences += 1
      let target = sitePath(url)
      // A tutorial chapter has no page of its own: the renderer links it as an anchor of the
      // table of contents ("/tutorials/table-of-contents/#a-linux-service").
      let parent = target.split(separator: "/").dropLast().joined(separator: "/")
      if pages[target] == nil, pages[parent]?["kind"] as? String == "overview", exists(parent + "/index.html") {
        continue
      }
      if pages[target] == nil { problems.append("\(page): links to \(url), which has no render JSON") }
      if !exists(target + "/index.html") { problems.append("\(page): links to \(url), which has no HTML page") }
    case "link":
      checkedReferences += 1
      if url.contains("://") || url.hasPrefix("mailto:") { continue }  // external: not checked offline
      let target = url.hasPrefix("/") ? sitePath(url) : page + "/../" + sitePath(url)
      if !exists(target) && !exists(target + "/index.html") {
        problems.append("\(page): relative link \(url) points at no file of the site")
      }
    default: break
    }
  }
  var texts: [String] = []
  strings(in: object["primaryContentSections"] ?? [], into: &texts)
  strings(in: object["abstract"] ?? [], into: &texts)
  strings(in: object["sections"] ?? [], into: &texts)
  for text in texts {
    for match in examplePattern.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
      for group in 1...2 {
        guard let range = Range(match.range(at: group), in: text) else { continue }
        let name = String(text[range])
        namedExamples.insert(name)
        if !files.fileExists(atPath: "\(examples)/\(name)/main.swift") {
          problems.append("\(page): names Example\(name), but there is no \(examples)/\(name)/main.swift")
        }
      }
    }
  }
}

// The pages a reader reaches from the landing page through Topics (and tutorial tables of contents).
guard let landing = pages.keys.filter({ $0.hasPrefix("documentation/") && $0.split(separator: "/").count == 2 }).first
else {
  FileHandle.standardError.write("docs-links: no landing page under \(site)/data/documentation\n".data(using: .utf8)!)
  exit(1)
}
var reachable: [String] = []
var seen = Set<String>()
var pending = [landing] + pages.keys.filter { $0.hasPrefix("tutorials/") && $0.split(separator: "/").count == 2 }
while let page = pending.first {
  pending.removeFirst()
  guard seen.insert(page).inserted, let object = pages[page] else { continue }
  reachable.append(page)
  let references = object["references"] as? [String: Any] ?? [:]
  var identifiers: [String] = []
  for section in object["topicSections"] as? [[String: Any]] ?? [] {
    identifiers += section["identifiers"] as? [String] ?? []
  }
  if page.hasPrefix("tutorials/") {  // a tutorial's chapters and steps are references of its pages
    identifiers += references.keys.filter { $0.contains("/tutorials/") }
  }
  for identifier in identifiers {
    guard let reference = references[identifier] as? [String: Any], reference["type"] as? String == "topic",
      let url = reference["url"] as? String
    else { continue }
    pending.append(sitePath(url))
  }
}
let kinds = reachable.compactMap { pages[$0]?["kind"] as? String }
if !kinds.contains("article") { problems.append("the landing page reaches no article through its Topics") }
if !kinds.contains("symbol") || kinds.filter({ $0 == "symbol" }).count < 2 {
  problems.append("the landing page reaches no symbol page through its Topics")
}

if arguments.count == 4 {
  let lines = reachable.map { page -> String in
    let metadata = pages[page]?["metadata"] as? [String: Any]
    return page + "\t" + (metadata?["title"] as? String ?? "")
  }
  try! (lines.joined(separator: "\n") + "\n").write(toFile: arguments[3], atomically: true, encoding: .utf8)
}
if !problems.isEmpty {
  for problem in problems { FileHandle.standardError.write("docs-links: \(problem)\n".data(using: .utf8)!) }
  exit(1)
}
print(
  "docs-links: \(pages.count) pages, \(checkedReferences) links resolve, \(namedExamples.count) examples named exist; "
    + "\(reachable.count) pages reachable from the landing page")
