-- build.lua: how the plugin was installed, read from what the managers leave in the editor.
-- lazy.nvim is tested for real (tests/suite/install.rs); packer.nvim and vim-plug cannot run
-- here, so their globals are set as they set them (packer_plugins[name].path, g:plugs[name].dir
-- with a trailing slash).
local t = ...
local build = require('agent_bash.build')

local function clear()
  _G.packer_plugins = nil
  vim.g.plugs = nil
end

t.describe('build: the way the plugin was installed', function()
  local root = vim.fn.tempname() .. '/agent-bash'
  vim.fn.mkdir(root, 'p')

  t.it('a plain runtimepath entry: :AgentBashBuild or cargo in the directory', function()
    clear()
    local install = build.install(root)
    t.eq('rtp', install.manager)
    local advice = table.concat(build.advice(install), '\n')
    t.ok(advice:find(':AgentBashBuild builds it now', 1, true), advice)
    t.ok(advice:find('cargo build --release', 1, true), advice)
  end)

  t.it('packer.nvim: its run key', function()
    clear()
    _G.packer_plugins = { other = { path = '/elsewhere' }, ['agent-bash'] = { path = root } }
    local install = build.install(root)
    t.eq({ manager = 'packer', name = 'agent-bash' }, install)
    local advice = table.concat(build.advice(install), '\n')
    t.ok(advice:find("run = 'cargo build --release'", 1, true), advice)
    clear()
  end)

  t.it("vim-plug: its 'do' option", function()
    clear()
    vim.g.plugs = { ['agent-bash'] = { dir = root .. '/' } }
    local install = build.install(root)
    t.eq({ manager = 'vim-plug', name = 'agent-bash' }, install)
    local advice = table.concat(build.advice(install), '\n')
    t.ok(advice:find("'do': 'cargo build --release'", 1, true), advice)
    t.ok(advice:find(':PlugInstall! agent-bash', 1, true), advice)
    clear()
  end)

  t.it('a Neovim package: no build step', function()
    clear()
    local pack = vim.fn.tempname() .. '/site/pack/plugins/start/agent-bash'
    vim.fn.mkdir(pack, 'p')
    local install = build.install(pack)
    t.eq('pack', install.manager)
    local advice = table.concat(build.advice(install), '\n')
    t.ok(advice:find('a Neovim package has no build step', 1, true), advice)
  end)
end)
